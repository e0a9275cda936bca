"""The prediction ledger: each routed request's prediction on the chosen endpoint, paired with its outcome.

The latency producer adds one entry per outcome it trains on (a TTFT at the first token, a TPOT at the
end): the endpoint, the request's objective, the model kind, the prediction routing used (the model's
quantile, with the per-endpoint correction, without the live-coverage factor that only the served figure
carries), the point prediction when the backend knows its models' point factor, and the outcome. Entries
live for ``window_s`` (at most ``max_entries``). Per endpoint and per objective, for each kind:

- **coverage**: the share of outcomes at or under the predicted quantile (nominal: the quantile, 0.9);
- **MAPE**: the mean of ``|point − actual| / actual`` (None without point predictions);
- **bias**: ``exp(median(log(point / actual))) − 1``: +0.2 means the point predictions run 20 % above the
  outcomes, −0.2 below (None without point predictions).

**Drift.** Every ``check_interval_s`` (on the clock of the entries, so the discrete-event benchmark sees the
same) each endpoint's coverage over the window, once it holds ``min_outcomes``, is compared with the band
``[coverage_low, coverage_high]``. An endpoint out of band for ``drift_after_s`` is *drifting*: counted,
logged once, and ``on_drift`` is called (the router asks for a retrain). Back in band, it is no longer.
Coverage is judged on the quantile routing used, not on the served one: the live-coverage factor moves the
served quantile until it covers again, which would hide the very drift the ledger is for.

**Fallback** (opt-in: ``fallback_after_s``). An endpoint drifting for ``fallback_after_s`` more, whose
*served* predictions (the live-coverage factor included) are out of band as well, is *distrusted*
(``distrusts``): the latency producer then routes the requests that have it among their candidates by the
heuristic profile, and still adds their predictions' outcomes here, so that the ledger sees the model
recover; back in band, the endpoint is trusted again. The live-coverage factor, one per kind for the whole
pool, makes up for an error of scale every endpoint shares (a model trained in a quieter hour): such a model
still ranks the endpoints, and falling back would give up what its predictions still do, the admitter's
shedding first of all. Why the fallback is off by default: docs/design/ledger-fallback.md.

The request path pays for one tuple appended to a deque; the figures are computed when asked (a scrape,
the status page) and at each drift check.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slorouter.clock import Clock
from slorouter.predictor.backend import LatencyPredictorBackend
from slorouter.predictor.features import MODEL_KINDS, ModelKind

log = logging.getLogger(__name__)

_KIND_INDEX = {kind: i for i, kind in enumerate(MODEL_KINDS)}
NO_OBJECTIVE = "none"  # the objective of a request that names none
DEFAULT_QUANTILE = 0.9  # the models' quantile where the router cannot read it (remote predictors)


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    window_s: float = 60.0
    max_entries: int = 20_000
    quantile: float = DEFAULT_QUANTILE
    coverage_low: float = 0.5
    coverage_high: float = 1.0
    min_outcomes: int = 30
    drift_after_s: float = 30.0
    fallback_after_s: float | None = None  # drifting this long more: routed by heuristics; None: never
    check_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")
        if not 0.0 <= self.coverage_low < self.coverage_high <= 1.0:
            raise ValueError(
                f"the coverage band must have 0 <= low < high <= 1, got [{self.coverage_low}, "
                f"{self.coverage_high}]"
            )
        if min(self.window_s, self.drift_after_s, self.check_interval_s) <= 0:
            raise ValueError("window_s, drift_after_s and check_interval_s must be > 0")
        if self.fallback_after_s is not None and self.fallback_after_s < 0:
            raise ValueError(f"fallback_after_s must be >= 0 or None, got {self.fallback_after_s}")
        if self.max_entries < 1 or self.min_outcomes < 1:
            raise ValueError("max_entries and min_outcomes must be >= 1")


@dataclass(frozen=True, slots=True)
class Accuracy:
    """How one group's predictions of one kind met their outcomes over the window."""

    outcomes: int
    coverage: float  # share of outcomes at or under the predicted quantile
    mape: float | None  # of the point predictions; None without them
    bias: float | None  # exp(median log(point / actual)) − 1; None without point predictions


@dataclass(frozen=True, slots=True)
class LedgerSummary:
    """The ledger's figures now: per endpoint and per objective, per kind."""

    window_s: float
    quantile: float
    endpoints: dict[str, dict[ModelKind, Accuracy]]
    objectives: dict[str, dict[ModelKind, Accuracy]]
    drifting: dict[str, list[ModelKind]]  # endpoint → the kinds it drifts on now
    drifts: int  # drifts that began since the start
    distrusted: list[str]  # endpoints drifting past fallback_after_s: requests with them route by heuristics


@dataclass(slots=True)
class _Drift:
    out_since: float | None = None  # when the coverage left the band (None: in band)
    drifting: bool = False
    since: float = 0.0  # when it began drifting
    served_coverage: float = 1.0  # the served predictions' coverage at the last check


@dataclass(slots=True)
class _Entries:
    at: deque[float] = field(default_factory=deque)
    # (endpoint, objective, kind index, predicted, point, actual, served)
    rows: deque[tuple[str, str, int, float, float, float, float]] = field(default_factory=deque)


class PredictionLedger:
    def __init__(
        self,
        clock: Clock,
        settings: LedgerSettings | None = None,
        *,
        point_factor: Callable[[ModelKind], float] | None = None,
        on_drift: Callable[[str, ModelKind], None] | None = None,
        members: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self.clock = clock
        self.settings = settings or LedgerSettings()
        # The backend's point factor of a kind (point = quantile × factor); None: no point predictions.
        self._point_factor = point_factor
        self.on_drift = on_drift
        self._members = members  # the pool's endpoints now: the drift of one that left is forgotten
        self._entries = _Entries()
        # Per (endpoint, kind), the outcomes in the window, those the predicted quantile covered and those the
        # served one did: the drift check reads these.
        self._counts: dict[tuple[str, ModelKind], list[int]] = {}
        self._drift: dict[tuple[str, ModelKind], _Drift] = {}
        self._next_check = -math.inf
        self.drifts = 0
        self.distrusted: frozenset[str] = frozenset()

    @classmethod
    def of_backend(
        cls,
        clock: Clock,
        settings: LedgerSettings,
        backend: LatencyPredictorBackend,
        members: Callable[[], Iterable[str]] | None = None,
    ) -> PredictionLedger:
        """The ledger of ``backend``'s predictions: its point factors, and a drift asks it for a retrain."""

        def retrain(_endpoint: str, kind: ModelKind) -> None:
            backend.retrain_soon(kind)

        return cls(clock, settings, point_factor=backend.point_factor, on_drift=retrain, members=members)

    def __len__(self) -> int:
        return len(self._entries.rows)

    def add(
        self,
        endpoint: str,
        objective: str,
        kind: ModelKind,
        predicted_ms: float,
        actual_ms: float,
        served_ms: float | None = None,
    ) -> None:
        """One outcome of a request that was predicted for: ``predicted_ms`` the quantile routing used (or
        would have, for a request the fallback routed) for ``endpoint``, the one that served it;
        ``served_ms`` the same with the live-coverage factor (None: ``predicted_ms``)."""
        if not (predicted_ms > 0.0 and actual_ms > 0.0 and math.isfinite(predicted_ms * actual_ms)):
            return
        if served_ms is None or not (served_ms > 0.0 and math.isfinite(served_ms)):
            served_ms = predicted_ms
        now = self.clock.now()
        factor = math.nan if self._point_factor is None else self._point_factor(kind)
        entries = self._entries
        entries.at.append(now)
        point_ms = predicted_ms * factor
        entries.rows.append(
            (endpoint, objective, _KIND_INDEX[kind], predicted_ms, point_ms, actual_ms, served_ms)
        )
        counts = self._counts.get((endpoint, kind))
        if counts is None:
            counts = self._counts[endpoint, kind] = [0, 0, 0]
        counts[0] += 1
        counts[1] += actual_ms <= predicted_ms
        counts[2] += actual_ms <= served_ms
        if len(entries.rows) > self.settings.max_entries:
            self._drop_oldest()
        if now >= self._next_check:
            self._next_check = now + self.settings.check_interval_s
            self.check(now)

    def _expire(self, now: float) -> None:
        entries, horizon = self._entries, now - self.settings.window_s
        while entries.at and entries.at[0] < horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        self._entries.at.popleft()
        endpoint, _, kind, predicted, _, actual, served = self._entries.rows.popleft()
        key = (endpoint, MODEL_KINDS[kind])
        counts = self._counts[key]
        counts[0] -= 1
        counts[1] -= actual <= predicted
        counts[2] -= actual <= served
        if not counts[0]:
            del self._counts[key]

    def _columns(self) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        rows = self._entries.rows
        if not rows:
            empty = np.empty(0)
            return [], [], empty.astype(np.int64), empty, empty, empty
        endpoints, objectives, kinds, predicted, point, actual, _ = zip(*rows, strict=True)
        return (
            list(endpoints),
            list(objectives),
            np.fromiter(kinds, np.int64, len(rows)),
            np.fromiter(predicted, np.float64, len(rows)),
            np.fromiter(point, np.float64, len(rows)),
            np.fromiter(actual, np.float64, len(rows)),
        )

    def summary(self) -> LedgerSummary:
        now = self.clock.now()
        self._expire(now)
        endpoints, objectives, kinds, predicted, point, actual = self._columns()
        by_endpoint = _grouped(endpoints, kinds, predicted, point, actual)
        by_objective = _grouped(objectives, kinds, predicted, point, actual)
        drifting: dict[str, list[ModelKind]] = {}
        for (endpoint, kind), drift in self._drift.items():
            if drift.drifting:
                drifting.setdefault(endpoint, []).append(kind)
        return LedgerSummary(
            window_s=self.settings.window_s,
            quantile=self.settings.quantile,
            endpoints=by_endpoint,
            objectives=by_objective,
            drifting=drifting,
            drifts=self.drifts,
            distrusted=sorted(self.distrusted),
        )

    def check(self, now: float) -> None:
        """Judge each endpoint's coverage against the band (see the module docstring)."""
        self._expire(now)
        if self._members is not None and self._drift:
            members = set(self._members())
            for key in [k for k in self._drift if k[0] not in members]:
                del self._drift[key]
        s = self.settings
        coverage: dict[tuple[str, ModelKind], float] = {}
        served_coverage: dict[tuple[str, ModelKind], float] = {}
        for key, (n, covered, served_covered) in self._counts.items():
            if n >= s.min_outcomes:
                coverage[key] = covered / n
                served_coverage[key] = served_covered / n
        for key in set(coverage) | set(self._drift):
            value = coverage.get(key)
            drift = self._drift.get(key)
            if value is None:  # too few outcomes to judge: a drift stays until outcomes say it is over
                if drift is not None and not drift.drifting:
                    del self._drift[key]
                continue
            if drift is None:
                drift = self._drift[key] = _Drift()
            drift.served_coverage = served_coverage[key]
            if s.coverage_low <= value <= s.coverage_high:
                if drift.drifting:
                    log.info("prediction drift over: %s's %s coverage %.2f is back in band", *key, value)
                drift.out_since, drift.drifting = None, False
                continue
            if drift.out_since is None:
                drift.out_since = now
            if not drift.drifting and now - drift.out_since >= s.drift_after_s:
                drift.drifting, drift.since = True, now
                self.drifts += 1
                endpoint, kind = key
                log.warning(
                    "prediction drift: %s's %s predictions covered %.2f of the outcomes of the last %g s "
                    "for %g s (band %g-%g, nominal %g); asking for a retrain",
                    endpoint,
                    kind.upper(),
                    value,
                    s.window_s,
                    now - drift.out_since,
                    s.coverage_low,
                    s.coverage_high,
                    s.quantile,
                )
                if self.on_drift is not None:
                    try:
                        self.on_drift(endpoint, kind)
                    except Exception:  # a failed retrain request must not stop the ledger
                        log.exception("asking for a retrain after a drift failed")
        self._update_distrust(now)

    def _update_distrust(self, now: float) -> None:
        s = self.settings
        after = s.fallback_after_s
        if after is None:
            return
        unserved = {
            endpoint: drift.served_coverage
            for (endpoint, _), drift in self._drift.items()
            if drift.drifting
            and now - drift.since >= after
            and not s.coverage_low <= drift.served_coverage <= s.coverage_high
        }
        distrusted = frozenset(unserved)
        for endpoint in sorted(distrusted - self.distrusted):
            log.warning(
                "prediction drift on %s outlasted the retrain by %g s and its served predictions cover "
                "%.2f (band %g-%g): requests with it among their candidates are routed by the heuristic "
                "profile until its predictions cover again",
                endpoint,
                after,
                unserved[endpoint],
                s.coverage_low,
                s.coverage_high,
            )
        for endpoint in sorted(self.distrusted - distrusted):
            log.info("predictions for %s are trusted again: routing by prediction", endpoint)
        self.distrusted = distrusted

    def distrusts(self, endpoints: Iterable[str]) -> bool:
        """Whether any of ``endpoints`` is distrusted (the request path: nothing is allocated while none
        is)."""
        return bool(self.distrusted) and not self.distrusted.isdisjoint(endpoints)


def _grouped(
    names: list[str], kinds: np.ndarray, predicted: np.ndarray, point: np.ndarray, actual: np.ndarray
) -> dict[str, dict[ModelKind, Accuracy]]:
    """The figures per (name, kind): one sort of the window by group, then a slice per group."""
    result: dict[str, dict[ModelKind, Accuracy]] = {}
    if not names:
        return result
    codes: dict[str, int] = {}
    inverse = np.fromiter((codes.setdefault(name, len(codes)) for name in names), np.int64, len(names))
    labels = list(codes)
    groups = inverse * len(MODEL_KINDS) + kinds
    order = np.argsort(groups, kind="stable")
    bounds = np.flatnonzero(np.diff(groups[order])) + 1
    for chosen in np.split(order, bounds):
        group = int(groups[chosen[0]])
        name, kind = str(labels[group // len(MODEL_KINDS)]), MODEL_KINDS[group % len(MODEL_KINDS)]
        result.setdefault(name, {})[kind] = _accuracy(predicted[chosen], point[chosen], actual[chosen])
    return result


def _accuracy(predicted: np.ndarray, point: np.ndarray, actual: np.ndarray) -> Accuracy:
    coverage = float((actual <= predicted).mean())
    if not np.isfinite(point).all():
        return Accuracy(len(actual), coverage, None, None)
    mape = float(np.mean(np.abs(point - actual) / actual))
    bias = float(np.expm1(np.median(np.log(point / actual))))
    return Accuracy(len(actual), coverage, mape, bias)


# The figures of an ``Accuracy`` exported, with their help text.
FIGURES = {
    "outcomes": "Outcomes in the prediction ledger's window",
    "coverage": "Share of outcomes at or under the predicted quantile routing used (nominal: its quantile)",
    "mape": "Mean absolute percentage error of the point predictions",
    "bias": "Median point prediction over outcome, minus 1 (> 0: predictions run high)",
}


class LedgerCollector(Collector):
    """The ledger's figures at each scrape: per endpoint and per objective, per kind; the drifts."""

    def __init__(self, ledger: PredictionLedger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[Metric]:
        summary = self.ledger.summary()
        for scope, groups in (("endpoint", summary.endpoints), ("objective", summary.objectives)):
            infix = "" if scope == "endpoint" else "_objective"
            families = {
                figure: GaugeMetricFamily(
                    f"slorouter_prediction_ledger{infix}_{figure}", f"{meaning}, per {scope} and model kind.",
                    labels=[scope, "kind"],
                )
                for figure, meaning in FIGURES.items()
            }  # fmt: skip
            for name, kinds in groups.items():
                for kind, accuracy in kinds.items():
                    for figure, family in families.items():
                        value = getattr(accuracy, figure)
                        if value is not None:
                            family.add_metric([name, kind], value)
            yield from families.values()
        drifting = GaugeMetricFamily(
            "slorouter_prediction_drifting",
            "1 while an endpoint's predictions of a kind drift (coverage out of band for drift_after_s).",
            labels=["endpoint", "kind"],
        )
        for endpoint, drifting_kinds in summary.drifting.items():
            for kind in drifting_kinds:
                drifting.add_metric([endpoint, kind], 1.0)
        yield drifting
        distrusted = GaugeMetricFamily(
            "slorouter_prediction_distrusted",
            "1 while requests with this endpoint among their candidates are routed by the heuristic profile "
            "(its drift outlasted fallback_after_s).",
            labels=["endpoint"],
        )
        for endpoint in summary.distrusted:
            distrusted.add_metric([endpoint], 1.0)
        yield distrusted
        drifts = CounterMetricFamily(
            "slorouter_prediction_drifts", "Drifts that began (each asked for a retrain).", labels=[]
        )
        drifts.add_metric([], summary.drifts)
        yield drifts
