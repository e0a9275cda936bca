"""Routing headers: latency SLOs, the inference objective (priority) and the prediction opt-in."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from slorouter.http.errors import RequestError

# The current original's names first: when a request carries both spellings, x-llm-d-slo-* wins.
SLO_TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
SLO_TPOT_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")
OBJECTIVE_HEADERS = ("x-gateway-inference-objective", "x-llm-d-inference-objective")
PREDICTION_HEADER = "x-prediction-based-scheduling"
PREDICTION_OFF_HEADER = "x-prediction-based-scheduling-off"
# An SLO beyond an hour is not a latency target but a typo (seconds sent as ms, an epoch, ...).
MAX_SLO_MS = 3_600_000.0
_ROUTING_HEADERS = frozenset(
    {*SLO_TTFT_HEADERS, *SLO_TPOT_HEADERS, *OBJECTIVE_HEADERS, PREDICTION_HEADER, PREDICTION_OFF_HEADER}
)
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True, slots=True)
class RoutingHints:
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    priority: int = 0
    use_prediction: bool = True
    objective: str | None = None


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return name, value
    return None


def _slo(headers: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    found = _first(headers, names)
    if found is None:
        return None
    name, raw = found
    try:
        value = float(raw.strip())
    except ValueError:
        raise RequestError(
            f"header {name} must be a number of milliseconds, got {raw!r}", param=name
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise RequestError(
            f"header {name} must be a positive number of milliseconds, got {raw!r}", param=name
        )
    if value > MAX_SLO_MS:
        raise RequestError(
            f"header {name} is {value:g} ms, more than an hour: not a latency target (milliseconds expected)",
            param=name,
        )
    return value


def parse_routing_headers(
    headers: Mapping[str, str], objectives: Mapping[str, int], *, prediction_by_default: bool
) -> RoutingHints:
    """Read the routing headers (lower-case names). Raises ``RequestError`` (400) naming a bad header."""
    if _ROUTING_HEADERS.isdisjoint(headers):  # most requests carry none: share one immutable default
        return _PREDICTED if prediction_by_default else _NOT_PREDICTED
    priority = 0
    objective = None
    found = _first(headers, OBJECTIVE_HEADERS)
    if found is not None:
        name, objective = found[0], found[1].strip()
        if objective not in objectives:
            known = ", ".join(sorted(objectives)) or "none are configured"
            raise RequestError(f"header {name}: unknown inference objective {objective!r} (known: {known})",
                               param=name)  # fmt: skip
        priority = objectives[objective]

    use_prediction = prediction_by_default
    flag = headers.get(PREDICTION_HEADER)
    if flag is not None:
        value = flag.strip().lower()
        if value in _TRUE:
            use_prediction = True
        elif value in _FALSE:
            use_prediction = False
        else:
            raise RequestError(f"header {PREDICTION_HEADER} must be true or false, got {flag!r}",
                               param=PREDICTION_HEADER)  # fmt: skip
    if PREDICTION_OFF_HEADER in headers:
        use_prediction = False
    return RoutingHints(
        slo_ttft_ms=_slo(headers, SLO_TTFT_HEADERS),
        slo_tpot_ms=_slo(headers, SLO_TPOT_HEADERS),
        priority=priority,
        use_prediction=use_prediction,
        objective=objective,
    )


_PREDICTED = RoutingHints(use_prediction=True)
_NOT_PREDICTED = RoutingHints(use_prediction=False)
