"""Data that flows through one scheduling cycle."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from slorouter.pool.state import Endpoint, PoolState

if TYPE_CHECKING:
    from slorouter.scheduling.pick_record import PickRecord


@dataclass(slots=True)
class InferenceRequest:
    """One parsed inference request, as the scheduler sees it.

    ``prompt_text`` is what the approximate prefix index hashes: the plain prompt for completions, the JSON
    of the ``messages`` array for chat completions. ``prompt_tokens`` is the router's token estimate.
    ``history_form`` says how a reply continues ``prompt_text`` in the next turn of a conversation
    (``slorouter.api.replies``: ``chat``, ``text``, or empty when it cannot, e.g. ``n`` > 1).
    ``state`` carries one plugin's per-request data from its produce step to its later hooks; what plugins
    tell the framework travels in typed results (``PreRequestResult``), never through ``state``.
    """

    request_id: str
    model: str
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    stream: bool = False
    target_model: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    objective: str = ""  # x-gateway-inference-objective; empty: none named
    hedge_copy: bool = False  # the copy the router sent elsewhere when the request was late (a hedge)
    slo_ttft_ms: float | None = None  # x-slo-ttft-ms; None = no TTFT target
    slo_tpot_ms: float | None = None  # x-slo-tpot-ms; None = no TPOT target
    use_prediction: bool = True  # x-prediction-based-scheduling: false routes by the heuristic fallback
    cache_salt: str = ""
    received_at: float = 0.0
    history_form: str = ""
    # Why a request that wanted predictions has none (set by the producer that could not predict:
    # "warming-up", "invalid-prediction", or the backend's reason, e.g. "breaker-open", "timeout"); the
    # profile handler then routes it by the heuristic profile, as ``Route.FALLBACK``.
    prediction_unavailable: str | None = None
    state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.target_model:
            self.target_model = self.model

    @property
    def sheddable(self) -> bool:
        return self.priority < 0

    @property
    def has_slo(self) -> bool:
        return self.slo_ttft_ms is not None or self.slo_tpot_ms is not None


class Candidates:
    """A read-only view of some pool endpoints for one request, with their signals as numpy columns.

    Columns (see ``slorouter.pool.state.ALL_COLUMNS``) are copied from the pool once, when first read, so a
    scheduling cycle sees one consistent snapshot. Data producers attach per-candidate arrays in ``attrs``
    (aligned with ``positions``); ``subset`` keeps columns and attributes aligned.
    """

    __slots__ = ("_columns", "attrs", "pool", "positions")

    def __init__(
        self,
        pool: PoolState,
        positions: np.ndarray,
        columns: dict[str, np.ndarray] | None = None,
        attrs: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.pool = pool
        self.positions = positions
        self._columns: dict[str, np.ndarray] = columns if columns is not None else {}
        self.attrs: dict[str, np.ndarray] = attrs if attrs is not None else {}

    @classmethod
    def healthy(cls, pool: PoolState) -> Candidates:
        return cls(pool, pool.healthy_positions())

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def endpoints(self) -> list[Endpoint]:
        eps = self.pool.endpoints
        return [eps[p] for p in self.positions.tolist()]

    def endpoint(self, i: int) -> Endpoint:
        return self.pool.endpoints[int(self.positions[i])]

    def column(self, name: str) -> np.ndarray:
        col = self._columns.get(name)
        if col is None:
            col = self.pool.columns[name][self.positions]
            self._columns[name] = col
        return col

    def values(self, name: str) -> list[Any]:
        """``column(name)`` as a list of Python numbers (for the plain-Python small-set scoring path)."""
        return self.column(name).tolist()

    def subset(self, selector: np.ndarray | Sequence[int]) -> Candidates:
        """Keep the candidates picked by a boolean mask or an array of indices, in that order."""
        sel = np.asarray(selector)
        return Candidates(
            self.pool,
            self.positions[sel],
            {name: col[sel] for name, col in self._columns.items()},
            {name: arr[sel] for name, arr in self.attrs.items()},
        )


class Route(StrEnum):
    """How a profile's pick was made (the ``x-slorouter-route`` response header)."""

    HEURISTIC = "heuristic"  # by the profile's heuristic scorers
    PREDICTED = "predicted"  # by predicted latency
    EXPLORE = "explore"  # predicted latency, but an exploration pick (to learn about an endpoint)
    FALLBACK = "fallback"  # prediction was wanted but unavailable: heuristics decided


class PickReason(StrEnum):
    """Why the chosen endpoint was chosen, as far as the pipeline can tell (most specific first).

    The value is the ``reason`` label of the regret series and the status page's key.
    """

    SCORE = "score"  # the highest total score among every candidate: no filter narrowed them
    AFFINITY = "affinity"  # the affinity filter kept only the cache-warm candidates
    LOAD_GATE = "load-gate"  # the affinity filter's TTFT load gate opened: the warm ones were too slow
    LATENCY_BAND = "latency-band"  # the latency band filter kept the candidates near the best prediction
    SLO_TIER = "slo-tier"  # the SLO tier filter kept the candidates predicted to meet the SLO
    EXPLORATION = "exploration"  # an epsilon-greedy exploration instead of the exploit path
    LANE = "lane"  # flow control's priority lane narrowed the candidates before the profile ran
    FILTER = "filter"  # another filter narrowed the candidates
    PICKER = "picker"  # the picker did not take the top score (random, weighted or round-robin pickers)


class CycleState(dict[str, Any]):
    """Scratch space shared by the plugins of one scheduling cycle.

    ``route``: a plugin that decides how its profile picks (the latency scorer) sets it while the profile
    runs; the profile copies it into its result (``Route.HEURISTIC`` when nobody set it). ``explored``: an
    epsilon-greedy plugin sets it when it explored instead of exploiting, so that the plugins after it mark
    the pick ``Route.EXPLORE`` and learn nothing from it as an exploited one. ``reason``: a filter that
    narrowed the candidates (or chose not to) says why, for the pick's record. ``record``: the cycle keeps a
    ``PickRecord`` of each profile's pick (in its result's ``record``); off, the profiles build none.
    """

    __slots__ = ("explored", "reason", "record", "route")

    def __init__(self, *, record: bool = False) -> None:
        super().__init__()
        self.route: Route | None = None
        self.explored = False
        self.reason: PickReason | None = None
        self.record = record


@dataclass(slots=True)
class ProfileRunResult:
    """What one profile picked: target endpoints, best first, their total scores, and their predicted TTFT
    (ms, before the live-coverage factor) when the candidates were predicted; ``record`` when the cycle
    asked for one."""

    targets: list[Endpoint]
    scores: list[float] = field(default_factory=list)
    route: Route = Route.HEURISTIC
    predicted_ttft_ms: list[float] | None = None
    record: PickRecord | None = None  # every candidate's view of the pick, when the cycle asked for it


@dataclass(slots=True)
class SchedulingResult:
    """What every profile that ran picked, which of them is primary, and, on ``Route.FALLBACK``, why the
    request went without predictions (``fallback_reason``; the x-slorouter-fallback-reason header)."""

    profile_results: dict[str, ProfileRunResult]
    primary_profile: str
    fallback_reason: str | None = None

    @property
    def primary(self) -> ProfileRunResult:
        return self.profile_results[self.primary_profile]

    @property
    def target(self) -> Endpoint:
        return self.primary.targets[0]

    @property
    def route(self) -> Route:
        return self.primary.route

    @property
    def record(self) -> PickRecord | None:
        """The primary profile's pick record (None unless the cycle asked for one)."""
        return self.primary.record


# On a request the router turned away (429): why (an admitter's reason, or flow control's).
DROPPED_REASON_HEADER = "x-slorouter-dropped-reason"


class SchedulingError(Exception):
    """A request cannot be scheduled. ``status`` is the HTTP status a front-end should answer with."""

    status = 500
    error_type = "server_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class NoCandidatesError(SchedulingError):
    """No healthy endpoint is available (HTTP 503)."""

    status = 503
    error_type = "service_unavailable"


class NoEndpointPickedError(SchedulingError):
    """Filters removed every candidate, or no profile produced a result (HTTP 429, as in the original)."""

    status = 429
    error_type = "rate_limit_exceeded"


class AdmissionDeniedError(SchedulingError):
    """An admitter rejected the request (HTTP 429 with a reason header; the original answers 500)."""

    status = 429
    error_type = "rate_limit_exceeded"
