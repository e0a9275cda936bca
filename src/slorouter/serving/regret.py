"""Routing regret of the picks a front-end made (``audit.regret``): Prometheus series by profile and reason,
and the totals of the status page (``RegretStatus``) and of the benchmark's runs.

Fed one ``PickRecord`` per request (its first pick: a retry or a hedged copy is not a routing choice of the
same kind). The formulas are ``slorouter.scheduling.regret``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from slorouter.metrics import HistogramSeries, RegretMetrics
from slorouter.scheduling.pick_record import PickRecord
from slorouter.scheduling.regret import Regret, regret_of


class _LabelSeries:
    """The series of one (profile, reason); the TTFT histogram's only once a pick has a TTFT estimate, so a
    pipeline without estimates shows none."""

    __slots__ = ("_ttft", "achieved", "avoidable", "metrics", "reachable")

    def __init__(self, metrics: RegretMetrics, profile: str, reason: str) -> None:
        self.metrics = metrics
        self.achieved = metrics.achieved.labels(profile, reason)
        self.reachable = metrics.reachable.labels(profile, reason)
        self.avoidable = metrics.avoidable.labels(profile, reason)
        self._ttft: HistogramSeries | None = None

    def ttft_regret(self, profile: str, reason: str) -> HistogramSeries:
        if self._ttft is None:
            self._ttft = self.metrics.ttft_regret.labels(profile, reason)
        return self._ttft


class RegretTotals(msgspec.Struct, kw_only=True):
    """Sums over picks (of one reason, or all of them)."""

    picks: int = 0
    achieved_prefix_tokens: int = 0
    reachable_prefix_tokens: int = 0
    avoidable_prefill_tokens: int = 0
    ttft_picks: int = 0  # picks with a TTFT estimate
    ttft_regret_ms: float = 0.0  # their summed TTFT regret

    def add(self, regret: Regret) -> None:
        self.picks += 1
        self.achieved_prefix_tokens += regret.achieved_prefix_tokens
        self.reachable_prefix_tokens += regret.reachable_prefix_tokens
        self.avoidable_prefill_tokens += regret.avoidable_prefill_tokens
        if regret.ttft_regret_ms is not None:
            self.ttft_picks += 1
            self.ttft_regret_ms += regret.ttft_regret_ms


class RegretStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The status page's ``regret`` section: totals since the router started."""

    picks: int
    # Achieved over reachable prefix tokens; None before any pick could have reused a prefix.
    reuse_achieved: float | None
    avoidable_prefill_tokens: int
    mean_ttft_regret_ms: float | None  # over the picks with a TTFT estimate
    by_reason: dict[str, RegretTotals]


def reuse_share(totals: RegretTotals) -> float | None:
    """Achieved over reachable prefix tokens (1: every pick went where the most was cached)."""
    reachable = totals.reachable_prefix_tokens
    return totals.achieved_prefix_tokens / reachable if reachable else None


@dataclass(eq=False)
class RegretLedger:
    """Regret of every pick it is given: totals (all and by reason), and the series when ``metrics``."""

    metrics: RegretMetrics | None = None

    def __post_init__(self) -> None:
        self.totals = RegretTotals()
        self.by_reason: dict[str, RegretTotals] = {}
        self._children: dict[tuple[str, str], _LabelSeries] = {}

    def observe(self, record: PickRecord) -> Regret:
        regret = regret_of(record)
        reason = record.reason.value
        self.totals.add(regret)
        totals = self.by_reason.get(reason)
        if totals is None:
            totals = self.by_reason[reason] = RegretTotals()
        totals.add(regret)
        if self.metrics is not None:
            series = self._series(record.profile, reason)
            series.achieved.inc(regret.achieved_prefix_tokens)
            series.reachable.inc(regret.reachable_prefix_tokens)
            series.avoidable.observe(regret.avoidable_prefill_tokens)
            if regret.ttft_regret_ms is not None:
                series.ttft_regret(record.profile, reason).observe(regret.ttft_regret_ms / 1000.0)
        return regret

    def _series(self, profile: str, reason: str) -> _LabelSeries:
        """One label pair's series, looked up once (``.labels()`` costs more than an update)."""
        series = self._children.get((profile, reason))
        if series is None:
            assert self.metrics is not None
            series = self._children[(profile, reason)] = _LabelSeries(self.metrics, profile, reason)
        return series

    def status(self) -> RegretStatus:
        totals = self.totals
        return RegretStatus(
            picks=totals.picks,
            reuse_achieved=reuse_share(totals),
            avoidable_prefill_tokens=totals.avoidable_prefill_tokens,
            mean_ttft_regret_ms=totals.ttft_regret_ms / totals.ttft_picks if totals.ttft_picks else None,
            by_reason={reason: msgspec.structs.replace(t) for reason, t in sorted(self.by_reason.items())},
        )
