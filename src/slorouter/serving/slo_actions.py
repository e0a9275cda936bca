"""SLOs kept after the pick: what the router does when a dispatched request overruns its SLO.

Per objective (``objectives.NAME.deadline``), a request that carries a TTFT SLO gets a ``Plan``:

- ``cancel`` (sheddable objectives): no first token by the TTFT SLO times ``ttft_factor`` → the upstream
  request is cancelled (the engine frees its slot and KV blocks) and the client gets an error naming the SLO
  and the time waited; with ``tpot``, a stream whose running TPOT is above its TPOT SLO times
  ``tpot_factor`` once ``tpot_min_tokens`` have come is cut the same way.
- ``hedge`` (other objectives): no first token by the hedge delay → the same request goes to the best other
  endpoint as well; the first to answer wins and the other is cancelled at once. The delay is the chosen
  endpoint's predicted TTFT times ``hedging.delay_factor`` (without a prediction, ``hedging.max_slo_share``
  of the SLO when set, else no delay: only a stall hedges), never before ``hedging.min_delay_ms``. Then the
  copy is picked; if it is predicted to answer after the request itself (``copy_due``), it is held back
  once, until it would not be. A request
  whose endpoint stalls (no token for ``hedging.stall_ms`` and ``stall_step_factor`` × its longest recent
  step while requests decode there; ``InFlightTracker.stalled``) is hedged at once,
  whatever the delay. A request is hedged once at most, only while the budget (``HedgeBudget``) has room
  and flow control's saturation detector (when flow control is on) says the pool is not saturated.

Front-ends (the gateway, the discrete-event benchmark, the Envoy picker) carry plans out; this module decides
and counts. A data plane that hedges by itself (Envoy, on a per-try timeout the picker sets) is armed at the
pick: the budget is taken then, and given back when the response shows that no copy was sent.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from slorouter.config import DeadlineConfig, HedgingConfig, ObjectiveConfig
from slorouter.pool.inflight import InFlightTracker
from slorouter.scheduling.types import InferenceRequest
from slorouter.serving.status import ObjectiveActionsStatus, SloActionsStatus

# The error code of a request the router cancelled at its deadline (the JSON error's and the SSE event's).
DEADLINE_EXCEEDED = "deadline_exceeded"
# The client's error message when the TTFT deadline passed: ``slo`` is ``ttft_slo(plan)``, ``waited`` the
# milliseconds waited (a template, so that a data plane that answers for the router can say it the same way).
TTFT_DEADLINE_MESSAGE = "{slo} passed after {waited} ms without a first token; the router cancelled it"


class Action(StrEnum):
    NONE = "none"
    CANCEL = "cancel"
    HEDGE = "hedge"


class HedgeOutcome(StrEnum):
    """How a hedge ended (``slorouter_hedges_total{outcome}``)."""

    SENT = "sent"  # a copy went out (every hedge counts here once, and once more in one of the below)
    WON = "won"  # the copy answered first; the original was cancelled
    LOST = "lost"  # the original answered first; the copy was cancelled
    FAILED = "failed"  # both copies failed
    CANCELLED = "cancelled"  # the request ended before either answered (the client left)


class HedgeSkip(StrEnum):
    """Why a due hedge was not sent (``slorouter_hedges_skipped_total{reason}``)."""

    BUDGET = "budget"  # more than hedging.max_share of the requests would be hedged
    SATURATED = "saturated"  # flow control's detector says the pool has no room
    NO_ENDPOINT = "no-endpoint"  # no other endpoint could take it


class CancelReason(StrEnum):
    TTFT = "ttft"
    TPOT = "tpot"


@dataclass(frozen=True, slots=True)
class Plan:
    """What the router does for one request after its pick. Times are clock seconds."""

    action: Action
    objective: str
    slo_ttft_ms: float
    deadline_at: float  # cancel: the TTFT deadline
    tpot_limit_ms: float | None  # cancel: the running-TPOT limit; None: not judged
    tpot_min_tokens: int


def ttft_slo(plan: Plan) -> str:
    """The SLO a TTFT deadline keeps, as the client's error message names it."""
    return f"the request's TTFT SLO of {plan.slo_ttft_ms:g} ms (objective {plan.objective!r})"


class HedgeBudget:
    """A token bucket that bounds hedges to a share of the requests that could be hedged.

    Every hedgeable request puts ``share`` in (up to ``burst``); a hedge takes 1. Counting requests rather
    than seconds keeps the bound exact at any rate, and needs no clock."""

    __slots__ = ("_level", "burst", "share")

    def __init__(self, share: float, burst: float) -> None:
        self.share = share
        self.burst = burst
        self._level = burst if share > 0 else 0.0

    def deposit(self) -> None:
        self._level = min(self.burst, self._level + self.share)

    def take(self) -> bool:
        if self._level < 1.0:
            return False
        self._level -= 1.0
        return True

    def give_back(self) -> None:
        """A hedge taken for (a data plane's, armed in advance) was not sent."""
        self._level = min(self.burst, self._level + 1.0)

    @property
    def level(self) -> float:
        return self._level


class SloActions:
    """The plans of one router, and the counts of what came of them."""

    def __init__(self, objectives: Mapping[str, ObjectiveConfig], hedging: HedgingConfig) -> None:
        self._deadlines: dict[str, DeadlineConfig] = {
            name: objective.deadline
            for name, objective in objectives.items()
            if objective.deadline.action != "none"
        }
        self.hedging = hedging
        self.budget = HedgeBudget(hedging.max_share, hedging.burst)
        # Every series an objective can have starts at 0, so that rates and alerts see it from the start.
        hedged = [name for name, d in self._deadlines.items() if d.action == "hedge"]
        cancelled = [name for name, d in self._deadlines.items() if d.action == "cancel"]
        self.hedges: dict[tuple[str, HedgeOutcome], int] = {(o, h): 0 for o in hedged for h in HedgeOutcome}
        self.skipped: dict[tuple[str, HedgeSkip], int] = {(o, r): 0 for o in hedged for r in HedgeSkip}
        self.cancelled: dict[tuple[str, CancelReason], int] = {
            (o, r): 0 for o in cancelled for r in CancelReason
        }
        self.stall_hedges: dict[str, int] = dict.fromkeys(hedged, 0)  # sent at once: the endpoint stalled
        self.loser_prefill_tokens = 0  # prompt tokens (not cached) sent to copies that lost

    @property
    def enabled(self) -> bool:
        return bool(self._deadlines)

    def plan(self, request: InferenceRequest) -> Plan | None:
        """The request's plan; None (most requests) when its objective acts on nothing or it has no TTFT
        SLO. A hedgeable request puts its share into the hedge budget here."""
        if not self._deadlines or request.slo_ttft_ms is None:
            return None
        deadline = self._deadlines.get(request.objective)
        if deadline is None:
            return None
        slo = request.slo_ttft_ms
        action = Action(deadline.action)
        if action is Action.HEDGE:
            self.budget.deposit()
        tpot_limit = None
        if action is Action.CANCEL and deadline.tpot and request.slo_tpot_ms is not None:
            tpot_limit = request.slo_tpot_ms * deadline.tpot_factor
        return Plan(
            action=action,
            objective=request.objective,
            slo_ttft_ms=slo,
            deadline_at=request.received_at + slo * deadline.ttft_factor / 1000.0,
            tpot_limit_ms=tpot_limit,
            tpot_min_tokens=deadline.tpot_min_tokens,
        )

    def hedge_at(
        self, plan: Plan, received_at: float, dispatched_at: float, predicted_ttft_ms: float | None
    ) -> float:
        """When the hedge is due if no token has come: the predicted TTFT times ``delay_factor`` after the
        dispatch (a request late against its own prediction: a long prompt predicted slow is not hedged for
        being slow), at the latest ``max_delay_slo_factor`` × the SLO after the arrival when set; without a
        prediction ``max_slo_share`` of the SLO after the arrival, or never (inf) when it is None. Never
        before ``min_slo_share`` of the SLO after the arrival when set, nor sooner than ``min_delay_ms``
        after the dispatch."""
        hedging = self.hedging
        if predicted_ttft_ms is not None and predicted_ttft_ms > 0:
            due = dispatched_at + predicted_ttft_ms * hedging.delay_factor / 1000.0
            cap = hedging.max_delay_slo_factor
            if cap is not None:
                due = min(due, received_at + plan.slo_ttft_ms * cap / 1000.0)
        elif hedging.max_slo_share is None:
            return math.inf  # without a prediction, late cannot be told from slow: only a stall hedges
        else:
            due = received_at + plan.slo_ttft_ms * hedging.max_slo_share / 1000.0
        floor = hedging.min_slo_share
        if floor is not None:
            due = max(due, received_at + plan.slo_ttft_ms * floor / 1000.0)
        return max(due, dispatched_at + hedging.min_delay_ms / 1000.0)

    def may_hedge(self, plan: Plan, saturated: bool, take: bool = True) -> bool:
        """Whether the due hedge may go out now (the budget is taken when it may, unless ``take`` is False:
        a check before the copy's pick); counts a skip."""
        if saturated:
            self.skipped[plan.objective, HedgeSkip.SATURATED] += 1
            return False
        if not (self.budget.take() if take else self.budget.level >= 1.0):
            self.skipped[plan.objective, HedgeSkip.BUDGET] += 1
            return False
        return True

    def watch_stalls(self, tracker: InFlightTracker) -> None:
        """Have ``tracker`` keep its endpoints' progress when stalls are hedged around
        (``hedging.stall_ms``)."""
        stall_s = self.stall_s
        if stall_s is not None and any(d.action == "hedge" for d in self._deadlines.values()):
            tracker.watch_stalls(stall_s, self.hedging.stall_step_factor)

    @property
    def stall_s(self) -> float | None:
        stall_ms = self.hedging.stall_ms
        return None if stall_ms is None else stall_ms / 1000.0

    def next_check(self, now: float, due: float) -> float:
        """When a request whose hedge (or held-back copy) is due at ``due`` is looked at next: at ``due``, and
        before it every half ``stall_ms`` for a stall of its endpoint."""
        stall_s = self.stall_s
        return due if stall_s is None else min(due, now + stall_s / 2)

    def copy_due(
        self, dispatched_at: float, now: float, request_ttft_ms: float | None, copy_ttft_ms: float | None
    ) -> float:
        """When the copy goes out (clock seconds; ``now`` or earlier: at once): once the request is overdue
        (past its own predicted TTFT ``request_ttft_ms`` after ``dispatched_at``) by the copy's predicted
        TTFT on its endpoint times ``overdue_factor``. Until then the request is expected to answer before
        a copy would, and a copy would only load another endpoint (on prefill-bound pools, with a long
        prefill that delays the requests behind it there and evicts their cached prefixes). At once when
        either prediction is missing or ``overdue_factor`` is None. The copy is held back once at most:
        when that time comes, it goes to the best endpoint then."""
        factor = self.hedging.overdue_factor
        if factor is None or request_ttft_ms is None or copy_ttft_ms is None:
            return now
        return dispatched_at + (request_ttft_ms + copy_ttft_ms * factor) / 1000.0

    def hedge_not_sent(self) -> None:
        """A hedge the data plane was armed for was not sent (the response began before it was due)."""
        self.budget.give_back()

    def hedge_ended(self, plan: Plan, outcome: HedgeOutcome, loser_prefill_tokens: int = 0) -> None:
        self.hedges[plan.objective, outcome] += 1
        if outcome is HedgeOutcome.WON or outcome is HedgeOutcome.LOST:
            self.loser_prefill_tokens += loser_prefill_tokens

    def hedged_for_stall(self, plan: Plan) -> None:
        self.stall_hedges[plan.objective] += 1

    def no_endpoint(self, plan: Plan) -> None:
        self.skipped[plan.objective, HedgeSkip.NO_ENDPOINT] += 1

    def cancelled_request(self, plan: Plan, reason: CancelReason) -> None:
        self.cancelled[plan.objective, reason] += 1

    def status(self) -> SloActionsStatus:
        """For the status page: per objective with a deadline, what came of it."""
        objectives = {
            name: ObjectiveActionsStatus(
                action=deadline.action,
                hedges=_by_label(self.hedges, name),
                hedges_skipped=_by_label(self.skipped, name),
                stall_hedges=self.stall_hedges.get(name, 0),
                cancelled=_by_label(self.cancelled, name),
            )
            for name, deadline in self._deadlines.items()
        }
        return SloActionsStatus(
            objectives=objectives,
            hedge_budget=round(self.budget.level, 3),
            loser_prefill_tokens=self.loser_prefill_tokens,
        )


class SloActionsCollector(Collector):
    """``slorouter_hedges_total``, ``slorouter_hedges_skipped_total``, ``slorouter_stall_hedges_total``,
    ``slorouter_deadline_cancellations_total`` and ``slorouter_hedge_loser_prefill_tokens_total``, read from
    the counts at scrape time."""

    def __init__(self, actions: SloActions) -> None:
        self._actions = actions

    def collect(self) -> Iterator[CounterMetricFamily]:
        actions = self._actions
        yield _family(
            "slorouter_hedges",
            "Hedged requests by objective and outcome (sent; then won, lost, failed or cancelled)",
            "outcome",
            actions.hedges,
        )
        yield _family(
            "slorouter_hedges_skipped",
            "Hedges that were due but not sent, by objective and reason (budget, saturated, no-endpoint)",
            "reason",
            actions.skipped,
        )
        stalls = CounterMetricFamily(
            "slorouter_stall_hedges",
            "Hedges sent at once because the request's endpoint had stalled, by objective (also in "
            "slorouter_hedges_total)",
            labels=["objective"],
        )
        for objective, n in sorted(actions.stall_hedges.items()):
            stalls.add_metric([objective], n)
        yield stalls
        yield _family(
            "slorouter_deadline_cancellations",
            "Requests the router cancelled at their deadline, by objective and SLO (ttft, tpot)",
            "slo",
            actions.cancelled,
        )
        yield CounterMetricFamily(
            "slorouter_hedge_loser_prefill_tokens",
            "Prompt tokens (less the expected prefix-cache hits) sent to the copies that lost a hedge",
            value=actions.loser_prefill_tokens,
        )


Label = TypeVar("Label", bound=StrEnum)  # an outcome, a reason, an SLO


def _by_label(counts: Mapping[tuple[str, Label], int], objective: str) -> dict[str, int]:
    """One objective's counts, by their label (outcome, reason, SLO)."""
    return {label.value: n for (name, label), n in counts.items() if name == objective}


def totals(*counts: Mapping[tuple[str, Label], int]) -> dict[str, int]:
    """Counts (of one router or several) summed over the objectives, by their label: the benchmark's run
    facts."""
    out: dict[str, int] = {}
    for each in counts:
        for (_, label), n in each.items():
            out[label.value] = out.get(label.value, 0) + n
    return out


def _family(
    name: str, documentation: str, label: str, counts: Mapping[tuple[str, Label], int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=["objective", label])
    for (objective, value), n in sorted(counts.items()):
        family.add_metric([objective, value.value], n)
    return family
