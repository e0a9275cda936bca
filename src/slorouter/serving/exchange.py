"""One inference request's walk around the Director, written once for every front-end.

A front-end speaks its protocol (HTTP/1.1 for the gateway, ext_proc for Envoy, events for the discrete-event
benchmark) and drives an ``Exchange`` through the same steps:

    parsed → admit → pick (a retry: pick again, the tried endpoints left out) → upstream body and context →
    response started → chunks (or tokens) → answered | failed | abandoned; or refused at any point before

The exchange owns what happens at each step: the request id, flow control's admission, the request's spans,
the scheduling and its timing, the dispatch, the body each endpoint is sent (the request's priority in its
engine's form, ``serving.engine_priority``), the routing facts (``RoutingFacts``: one derivation for the
response headers and the spans), reading the response as it passes (SSE events, the reply text the plugins
asked for, ``usage``), how the request ended (a typed ``Termination``), and the outcome: the front-end
metrics, the status page, the traffic recording. A change to the request path is made here, once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slorouter.api.requests import ParsedRequest
from slorouter.api.routing_headers import RoutingHints
from slorouter.api.stream import StreamObserver, observe_body
from slorouter.director import NOT_QUEUED, Admission, Director, RequestLifecycle
from slorouter.metrics import GatewayMetrics
from slorouter.scheduling.plugin import Termination
from slorouter.scheduling.regret import Regret
from slorouter.scheduling.types import InferenceRequest, SchedulingError, SchedulingResult
from slorouter.serving.audit import PickAudit
from slorouter.serving.engine_priority import EnginePriority
from slorouter.serving.headers import RoutingFacts
from slorouter.serving.outcome import OutcomeRecorder
from slorouter.serving.recording import TrafficRecorder
from slorouter.serving.requests import RequestIds, inference_request
from slorouter.serving.slo_actions import (
    TTFT_DEADLINE_MESSAGE,
    Action,
    CancelReason,
    HedgeOutcome,
    Plan,
    SloActions,
    ttft_slo,
)
from slorouter.serving.status import RouterStats
from slorouter.serving.tracing import (
    outcome_attributes,
    parsed_attributes,
    regret_attributes,
    request_attributes,
    upstream_attributes,
)
from slorouter.serving.traffic_window import TrafficWindow

if TYPE_CHECKING:
    from slorouter.tracing.tracer import RequestTrace, Tracing

# A whole (non-SSE) response body is kept for the reply-text hooks only up to this size.
MAX_KEPT_RESPONSE_BYTES = 4 << 20
# How the request ended (a ``Termination``), on its span and on a failed attempt's upstream span.
TERMINATION_ATTRIBUTE = "slorouter.termination"


@dataclass(eq=False)
class FrontEnd:
    """What every exchange of one front-end shares. ``metrics`` None: the benchmark, which keeps its own
    records (no metrics, status page, recording or spans)."""

    director: Director
    name: str  # the span's slorouter.front_end: gateway, extproc
    metrics: GatewayMetrics | None = None
    tracing: Tracing | None = None  # None: tracing is off
    stats: RouterStats | None = None  # the status page's per-request figures
    traffic: TrafficRecorder | None = None  # --record
    window: TrafficWindow | None = None  # recent traffic, for the tuner
    actions: SloActions | None = None  # deadlines and hedges (None: none configured)
    engine_priority: EnginePriority | None = None  # None: no model server is sent a priority
    audit: PickAudit | None = None  # routing regret and scores on the wire (None: neither)
    outcomes: OutcomeRecorder | None = field(init=False)
    ids: RequestIds = field(init=False, default_factory=RequestIds)

    def __post_init__(self) -> None:
        if self.actions is not None:
            self.actions.watch_stalls(self.director.tracker)
        self.outcomes = (
            None
            if self.metrics is None
            else OutcomeRecorder(
                self.metrics,
                e2e_as_ttft=self.director.predicts_end_to_end,
                stats=self.stats,
                traffic=self.traffic,
            )
        )

    @property
    def scores_listed(self) -> int | None:
        """How many candidates the scores header lists; None: it is off."""
        return None if self.audit is None else self.audit.scores_max_candidates

    def exchange(self, method: str, path: str, trace_context: Mapping[str, str] | None = None) -> Exchange:
        """A new exchange for an inference request on ``path``; its span starts now when tracing is on
        (``trace_context``: the client's W3C trace-context headers, lower-case names)."""
        tracing = self.tracing
        trace = None
        if tracing is not None:  # the only cost of tracing when it is off
            trace = tracing.start_request(trace_context or {}, request_attributes(self.name, method, path))
        return Exchange(self, path, trace)


class Exchange:
    """One inference request, from its parsed body to the end of its response (see the module docstring).

    ``request`` is set once parsed; ``lifecycle`` and ``facts`` by each pick; ``tried`` lists the endpoints
    of failed attempts, which a new pick leaves out. ``plan`` is what happens if the request overruns its
    SLO after the pick (``serving.slo_actions``; None for most requests); ``hedged`` whether a copy was sent
    (by the router or the data plane); ``hedge_copy`` the router's copy's lifecycle once sent, ``copy`` the
    same while both copies are in flight; ``hedge_due`` when a hedge the data plane sends itself is due, while
    it is armed (``hedge_delegated``)."""

    __slots__ = (
        "_client_priority",
        "_copy_due",
        "_engine_priority",
        "_first_seen",
        "_hedge_held",
        "_hedge_next",
        "_hedge_settled",
        "_hedge_stalled",
        "_kept",
        "_observer",
        "_over",
        "admission",
        "copy",
        "facts",
        "front",
        "hedge_copy",
        "hedge_due",
        "hedged",
        "lifecycle",
        "path",
        "plan",
        "regret",
        "request",
        "trace",
        "tried",
    )

    def __init__(self, front: FrontEnd, path: str, trace: RequestTrace | None = None) -> None:
        self.front = front
        self.path = path
        self.trace = trace
        self.request: InferenceRequest | None = None
        self.admission: Admission = NOT_QUEUED
        self.lifecycle: RequestLifecycle | None = None
        self.facts: RoutingFacts | None = None
        self.regret: Regret | None = None  # the first pick's routing regret, when audit.regret is on
        self.tried: list[str] = []
        self.plan: Plan | None = None
        self.copy: RequestLifecycle | None = None
        self.hedge_copy: RequestLifecycle | None = None
        self._hedge_settled = False  # the outcome of the router's hedge is counted
        self.hedged = False  # a copy was sent (never twice)
        self.hedge_due: float | None = None
        # The router's hedge: when its copy goes (unless a stall comes first), when the request is looked at
        # next (None: never again), whether the copy was held back once, and whether the request's endpoint
        # stalled at the last look.
        self._copy_due: float | None = None
        self._hedge_next: float | None = None
        self._hedge_held = False
        self._hedge_stalled = False
        self._observer: StreamObserver | None = None
        self._kept: bytearray | None = None
        self._first_seen = False  # the window was told of the first token
        self._engine_priority = 0  # the priority the model server gets (higher first), if it gets one
        self._client_priority = False  # the body has a "priority" of its own
        self._over = False  # answered, refused or abandoned: later ends are no-ops

    @classmethod
    def of(cls, front: FrontEnd, request: InferenceRequest) -> Exchange:
        """An exchange for a request built by the front-end itself (the benchmark's)."""
        exchange = cls(front, "")
        exchange.request = request
        if front.actions is not None:
            exchange.plan = front.actions.plan(request)
        return exchange

    # --- the request ---------------------------------------------------------------------------------
    def parsed(
        self, parsed: ParsedRequest, hints: RoutingHints, headers: dict[str, str], request_id: str | None
    ) -> InferenceRequest:
        """The scheduler's view of the parsed request; ``request_id`` None: a new one."""
        front = self.front
        request = inference_request(
            parsed, hints, headers, request_id or front.ids.next(), front.director.clock.now()
        )
        self.request = request
        if front.actions is not None:
            self.plan = front.actions.plan(request)
        engine = front.engine_priority
        if engine is not None:
            self._engine_priority = engine.priority(hints)
            self._client_priority = parsed.client_priority
        if self.trace is not None:
            self.trace.set(parsed_attributes(request))
        return request

    async def admit(self) -> None:
        """Wait in flow control until the pool has room (at once without it). Raises ``SchedulingError``
        (429, 503) when flow control turns the request away; the refusal is recorded."""
        assert self.request is not None
        try:
            self.admission = await self.front.director.admit_async(self.request)
        except SchedulingError as exc:
            self.refuse(exc.status, exc.message)
            raise

    async def pick(self, exclude: Collection[str] = ()) -> RequestLifecycle:
        """Schedule (awaiting data producers that wait on I/O) and dispatch; ``exclude`` and the tried
        endpoints are left out. Raises ``SchedulingError``, which the front-end answers (``refuse``) or,
        after a failed attempt, turns into the last failure's answer."""
        assert self.request is not None
        started = time.perf_counter()
        self._begin_schedule()
        try:
            result = await self.front.director.schedule_async(
                self.request, exclude=self._excluded(exclude), admission=self.admission
            )
        except SchedulingError as exc:
            self._schedule_failed(exc)
            raise
        except asyncio.CancelledError:
            self.admission.release()
            raise
        metrics = self.front.metrics
        if metrics is not None:
            metrics.scheduling_duration.observe(time.perf_counter() - started)
            if self.tried:
                metrics.upstream_retries.inc()
        return self._dispatch(self.front.director.dispatch(self.request, result, self.admission))

    def pick_now(self) -> RequestLifecycle:
        """``pick`` for the discrete-event benchmark (no event loop: every producer answers at once)."""
        assert self.request is not None
        try:
            result = self.front.director.schedule(self.request, admission=self.admission)
        except SchedulingError:
            self.admission.release()
            raise
        return self._dispatch(self.front.director.dispatch(self.request, result, self.admission))

    def upstream_body(self, body: bytes, lifecycle: RequestLifecycle | None = None) -> bytes:
        """The request body for the current pick's endpoint (or ``lifecycle``'s: a hedged copy's): the
        client's ``body`` with the request's priority in the field and the sense its model server takes
        (``pool.engine_priority``), or ``body`` itself when that server is sent none. Called after each
        pick: a retry elsewhere may take another form."""
        engine = self.front.engine_priority
        if engine is None:
            return body
        lifecycle = lifecycle or self.lifecycle
        assert lifecycle is not None
        return engine.body(
            body, self._engine_priority, lifecycle.target, client_priority=self._client_priority
        )

    def upstream_context(self, address: str) -> dict[str, str]:
        """The upstream span starts (tracing on): its W3C context, for the request to the model server."""
        if self.trace is None:
            return {}
        return self.trace.begin_upstream(upstream_attributes(address))

    # --- after the pick: deadlines and hedges ------------------------------------------------------------
    @property
    def hedge_pending(self) -> bool:
        """A copy was sent and the hedge's outcome is not known yet."""
        return self.hedge_copy is not None and not self._hedge_settled

    def hedge_at(self) -> float | None:
        """When the front-end calls ``hedge`` next (clock seconds) if no token has come; None: never."""
        plan, lifecycle, actions = self.plan, self.lifecycle, self.front.actions
        if plan is None or plan.action is not Action.HEDGE or self.hedged or lifecycle is None:
            return None
        if self._copy_due is None:
            assert actions is not None
            self._copy_due = self._delay_due()
            self._hedge_next = actions.next_check(lifecycle.response.dispatched_at, self._copy_due)
        if self._hedge_next is not None and math.isinf(self._hedge_next):
            return None  # no delay (no prediction) and no stall check: never
        return self._hedge_next

    def _delay_due(self) -> float:
        """When the hedge delay (``SloActions.hedge_at``) ends."""
        plan, lifecycle, actions = self.plan, self.lifecycle, self.front.actions
        assert plan is not None and lifecycle is not None and actions is not None
        prediction = lifecycle.prediction
        return actions.hedge_at(
            plan,
            lifecycle.request.received_at,
            lifecycle.response.dispatched_at,
            # The model's own quantile: the live-coverage factor, raised by the very misses a hedge is for,
            # would put the hedge off on a pool that stalls.
            prediction.model_ttft_ms if prediction is not None else None,
        )

    async def hedge(self) -> RequestLifecycle | None:
        """Look at the request (``hedge_at`` said to) and send a copy to the best other endpoint when its
        hedge is due or its endpoint stalled: the copy's lifecycle, or None. None and ``hedge_at`` None: the
        budget, the pool's saturation or the lack of another endpoint said no (counted). None and a
        ``hedge_at``: not yet (not due, or the copy was predicted to answer after the request itself and is
        held back once, ``SloActions.copy_due``)."""
        copy = self._hedge_copy()
        if copy is None:
            return None
        try:
            result = await self.front.director.schedule_async(copy, exclude=self._hedge_excluded())
        except SchedulingError:
            self._no_hedge_endpoint()
            return None
        return self._hedge_picked(copy, result)

    def hedge_now(self) -> RequestLifecycle | None:
        """``hedge`` for the discrete-event benchmark (every producer answers at once)."""
        copy = self._hedge_copy()
        if copy is None:
            return None
        try:
            result = self.front.director.schedule(copy, exclude=self._hedge_excluded())
        except SchedulingError:
            self._no_hedge_endpoint()
            return None
        return self._hedge_picked(copy, result)

    def hedge_delegated(self, alternatives: int) -> float | None:
        """For a data plane that sends the hedged copy itself (Envoy, on the per-try timeout the picker sets,
        to one of the ``alternatives`` other endpoints the pick listed): the hedge is armed now, for when it
        is due (clock seconds, returned); None when none is armed (no hedge plan, or no other endpoint, the
        budget or the pool's saturation says no: counted). The budget is taken now, and given back if the
        response begins before the hedge was due (``data_plane_answered``). Envoy cannot ask the router
        again, so the copy is neither held back nor sent early for a stall."""
        if self.hedge_at() is None:
            return None
        due = self._delay_due()
        if math.isinf(due):  # no prediction: only a stall would hedge it, which Envoy cannot see
            return None
        if alternatives < 1:
            self._no_hedge_endpoint()
            return None
        if not self._may_hedge():
            return None
        self.hedge_due = due
        return due

    def data_plane_answered(
        self, served: str | None, attempts: int | None, failed: bool
    ) -> HedgeOutcome | None:
        """The response of a request whose hedge the data plane carries (``hedge_delegated``) began: served
        from ``served`` after ``attempts`` upstream attempts (None: the data plane does not say; then only a
        response from another endpoint counts as a hedge), ``failed`` when it is the data plane's own answer
        to failed attempts. Returns the hedge's outcome, counted (WON: the copy served it, and the request's
        load, hooks and samples follow the copy from when it was sent), or None when no copy was sent (the
        budget is given back) or none was armed. The copy that lost was never counted in flight: the data
        plane sent it."""
        due, plan, lifecycle, actions = self.hedge_due, self.plan, self.lifecycle, self.front.actions
        if due is None or plan is None or lifecycle is None or actions is None:
            return None
        self.hedge_due = None
        picked = lifecycle.target.address
        elsewhere = served is not None and served != picked
        # A retry after a failed connection is an attempt too, but it goes out long before the hedge is due.
        # Without the attempt count, only a response from another endpoint says that a copy went out.
        sent = attempts >= 2 if attempts is not None else elsewhere and not failed
        if self.front.director.clock.now() < due or not sent:
            actions.hedge_not_sent()
            return None
        self.hedged = True
        actions.hedge_ended(plan, HedgeOutcome.SENT)
        if failed:
            outcome = HedgeOutcome.FAILED
            actions.hedge_ended(plan, outcome)
        elif elsewhere:
            assert served is not None
            outcome = HedgeOutcome.WON
            loser_prefill = lifecycle.prefill_tokens
            if self.served_by(served, dispatched_at=due):
                self.tried.append(picked)
            actions.hedge_ended(plan, outcome, loser_prefill)
        else:
            outcome = HedgeOutcome.LOST  # the copy's prompt tokens are not known: its endpoint never was
            actions.hedge_ended(plan, outcome)
        if self.trace is not None:
            self.trace.set({"slorouter.hedge": outcome.value})
        return outcome

    def _may_hedge(self, take: bool = True) -> bool:
        plan, actions = self.plan, self.front.actions
        assert plan is not None and actions is not None
        controller = self.front.director.flow_control
        saturated = controller is not None and controller.detector.saturation() >= 1.0
        return actions.may_hedge(plan, saturated, take)

    def _hedge_copy(self) -> InferenceRequest | None:
        """The copy to pick for, when the request is to be hedged now (see ``hedge``)."""
        lifecycle, actions = self.lifecycle, self.front.actions
        if self.hedge_at() is None:
            return None
        assert lifecycle is not None and actions is not None and self._copy_due is not None
        now = self.front.director.clock.now()
        self._hedge_stalled = stalled = self.front.director.tracker.stalled(lifecycle.target.address, now)
        if now < self._copy_due and not stalled:
            self._hedge_next = actions.next_check(now, self._copy_due)
            return None
        self._hedge_next = None
        if not self._may_hedge(take=False):
            return None
        # The plugins' per-request state is per copy (and per pick of it).
        return dataclasses.replace(lifecycle.request, state={}, hedge_copy=True)

    def _hedge_picked(self, copy: InferenceRequest, result: SchedulingResult) -> RequestLifecycle | None:
        """The copy's pick: sent, unless (once, and not for a stall) it is predicted to answer after the
        request itself; then it is held back until it would not be (``SloActions.copy_due``)."""
        plan, actions, lifecycle = self.plan, self.front.actions, self.lifecycle
        assert plan is not None and actions is not None and lifecycle is not None
        if not self._hedge_stalled and not self._hedge_held:
            prediction = lifecycle.prediction
            predicted = result.primary.predicted_ttft_ms
            now = self.front.director.clock.now()
            due = actions.copy_due(
                lifecycle.response.dispatched_at,
                now,
                prediction.model_ttft_ms if prediction is not None else None,
                predicted[0] if predicted else None,
            )
            if due > now:
                self._hedge_held = True
                self._copy_due = due
                self._hedge_next = actions.next_check(now, due)
                return None
        if not self._may_hedge():
            return None
        if self._hedge_stalled:
            actions.hedged_for_stall(plan)
        return self._hedge_dispatched(copy, result)

    def _hedge_excluded(self) -> list[str]:
        """Where the copy may not go: the request's own endpoint, those that failed it, and stalled ones."""
        assert self.lifecycle is not None
        director = self.front.director
        return [
            *self.tried,
            self.lifecycle.target.address,
            *director.tracker.stalled_endpoints(director.clock.now()),
        ]

    def _no_hedge_endpoint(self) -> None:
        assert self.plan is not None and self.front.actions is not None
        self.front.actions.no_endpoint(self.plan)

    def _hedge_dispatched(self, copy: InferenceRequest, result: SchedulingResult) -> RequestLifecycle:
        plan, actions = self.plan, self.front.actions
        assert plan is not None and actions is not None
        self.hedged = True
        lifecycle = self.copy = self.hedge_copy = self.front.director.dispatch(copy, result)
        actions.hedge_ended(plan, HedgeOutcome.SENT)
        if self.trace is not None:
            self.trace.set({"slorouter.hedge.endpoint": result.target.address})
        return lifecycle

    def raced(self, winner: RequestLifecycle) -> None:
        """A hedged request answered: ``winner`` (the original or the copy) came first. The other, if it still
        runs, is cancelled (its load released); the exchange goes on with the winner. Counted once."""
        if not self.hedge_pending:
            return
        copy, primary, plan, actions = self.copy, self.lifecycle, self.plan, self.front.actions
        assert primary is not None and plan is not None and actions is not None
        self.copy = None
        self._hedge_settled = True
        outcome = HedgeOutcome.WON if winner is self.hedge_copy else HedgeOutcome.LOST
        thrown = 0
        if copy is not None:  # both were still in flight
            loser = primary if winner is copy else copy
            loser.end(Termination.CANCELLED, detail=f"hedge: {winner.target.address} answered first")
            thrown = loser.prefill_tokens
        actions.hedge_ended(plan, outcome, thrown)
        if winner is not primary:
            self.tried.append(primary.target.address)
            self.lifecycle = winner
            self.facts = RoutingFacts.of(winner, self.front.scores_listed)
        if self.trace is not None:
            self.trace.set({"slorouter.hedge": outcome.value})

    def hedge_failed(self, lifecycle: RequestLifecycle, cause: Termination, detail: str, phase: str) -> None:
        """One of the two copies failed before answering; the other goes on alone (it becomes the request's
        lifecycle). The failed one counts as a tried endpoint and an upstream failure."""
        copy, primary = self.copy, self.lifecycle
        assert copy is not None and primary is not None
        self.copy = None
        lifecycle.end(cause, detail=detail)
        address = lifecycle.target.address
        self.tried.append(address)
        if self.front.metrics is not None:
            self.front.metrics.upstream_failures.labels(address, phase).inc()
        if lifecycle is primary:
            self.lifecycle = copy
            self.facts = RoutingFacts.of(copy, self.front.scores_listed)

    def copies_failed(self) -> None:
        """Both copies failed: counted (the front-end answers with the last failure)."""
        plan, actions = self.plan, self.front.actions
        if self.hedge_pending and plan is not None and actions is not None:
            self._hedge_settled = True
            actions.hedge_ended(plan, HedgeOutcome.FAILED)

    def deadline_passed(self) -> str:
        """The TTFT deadline passed without a first token (a ``cancel`` plan): the upstream request is
        being cancelled. Ends the attempt and returns the client's error message."""
        plan, lifecycle, actions = self.plan, self.lifecycle, self.front.actions
        assert plan is not None and lifecycle is not None and actions is not None
        waited_ms = (self.front.director.clock.now() - lifecycle.request.received_at) * 1000.0
        actions.cancelled_request(plan, CancelReason.TTFT)
        message = TTFT_DEADLINE_MESSAGE.format(slo=ttft_slo(plan), waited=f"{waited_ms:.0f}")
        lifecycle.end(Termination.CANCELLED, detail="deadline: ttft")
        self.tried.append(lifecycle.target.address)
        self._count_violation("ttft")
        return message

    def tpot_overrun(self) -> str | None:
        """A stream's running TPOT is above its limit (a ``cancel`` plan with ``tpot``): the request ends
        here (``CANCELLED``), and the message is for the error event the front-end ends the client's stream
        with; None while it keeps to it."""
        plan, lifecycle = self.plan, self.lifecycle
        if plan is None or plan.tpot_limit_ms is None or lifecycle is None:
            return None
        response = lifecycle.response
        if response.tokens < plan.tpot_min_tokens or response.first_token_at is None:
            return None
        running_ms = (
            (self.front.director.clock.now() - response.first_token_at) * 1000.0 / (response.tokens - 1)
        )
        if running_ms <= plan.tpot_limit_ms:
            return None
        actions = self.front.actions
        assert actions is not None
        actions.cancelled_request(plan, CancelReason.TPOT)
        self._count_violation("tpot")
        self.answered(Termination.CANCELLED, "deadline: tpot")
        return (
            f"the stream's TPOT of {running_ms:.1f} ms over {response.tokens} tokens is above its limit of "
            f"{plan.tpot_limit_ms:g} ms (objective {plan.objective!r}); the router cancelled it"
        )

    def served_by(self, address: str, dispatched_at: float | None = None) -> bool:
        """The data plane served the request from ``address`` (a retry on a fallback of the pick, or its
        hedged copy, sent at ``dispatched_at``): the load, the response hooks and the routing facts follow
        it. False when nothing changed."""
        lifecycle = self.lifecycle
        if lifecycle is None or not lifecycle.served_by(address, dispatched_at):
            return False
        assert self.facts is not None
        self.facts.endpoint = lifecycle.target.address
        return True

    # --- the response --------------------------------------------------------------------------------
    def started(
        self, status: int, streaming: bool, *, keeps_body: bool = True, bytes_follow: bool = True
    ) -> bool:
        """The response's status and kind reached the router. True when its body is read on the way: an
        SSE stream (tokens, reply text, usage), or a whole body whose reply text a plugin asked for or whose
        usage the tuner's window needs (kept, bounded, when ``keeps_body``: a front-end that reads the whole
        body itself passes it to ``answered``). ``bytes_follow`` False: the front-end reports ``tokens`` and
        ``reply_text`` itself (the benchmark's engines produce tokens, not bytes)."""
        lifecycle = self.lifecycle
        assert lifecycle is not None
        lifecycle.on_headers(status, streaming)
        if not bytes_follow:
            return False
        history_form = lifecycle.request.history_form
        if streaming and status == 200:
            self._observer = StreamObserver(lifecycle, history_form)
            return True
        # A whole body is kept when a plugin wants its reply text, or for the tuner's window (its usage: the
        # output tokens the replay needs).
        wanted = history_form and lifecycle.reply_chars_wanted > 0
        if keeps_body and status < 400 and (wanted or self.front.window is not None):
            self._kept = bytearray()
            return True
        return False

    def chunk(self, data: bytes) -> None:
        """Body bytes as they pass to the client (after ``started``)."""
        observer = self._observer
        if observer is not None:
            observer.feed(data)
            if not self._first_seen and self.front.window is not None:
                self._tell_first_token()
            return
        kept = self._kept
        if kept is not None:
            if len(kept) + len(data) <= MAX_KEPT_RESPONSE_BYTES:
                kept += data
            else:
                self._kept = None

    def tokens(self, count: int = 1) -> None:
        """Output tokens, for a front-end that sees tokens rather than bytes (the benchmark)."""
        assert self.lifecycle is not None
        self.lifecycle.on_tokens(count)
        if not self._first_seen and self.front.window is not None:
            self._tell_first_token()

    def _tell_first_token(self) -> None:
        lifecycle = self.lifecycle
        window = self.front.window
        assert lifecycle is not None and window is not None
        first = lifecycle.response.first_token_at
        if first is not None:
            self._first_seen = True
            received = lifecycle.request.received_at
            window.first_token(received, (first - received) * 1000.0)

    def reply_text(self, text: str) -> None:
        assert self.lifecycle is not None
        self.lifecycle.on_reply_text(text)

    def answered(
        self,
        cause: Termination = Termination.COMPLETE,
        detail: str = "",
        *,
        body: bytes | None = None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        """The response went to the client and ended: whole (``COMPLETE``, whatever its status) or cut
        (``cause``, e.g. the model server failed mid-stream). ``body``: the whole body, when the front-end
        read it; ``usage``: the server's, when the front-end read it itself."""
        lifecycle = self.lifecycle
        if self._over or lifecycle is None:
            return
        self._over = True
        if body is None and self._kept is not None:
            body = bytes(self._kept)  # the whole body, kept on the way
        if cause is Termination.COMPLETE and lifecycle.response.status < 400:
            observer = self._observer
            if observer is not None:
                usage = observer.finish()
            elif body is not None:
                observe_body(lifecycle, body, lifecycle.request.history_form)
        lifecycle.end(cause, usage=usage, detail=detail)
        front = self.front
        outcomes = front.outcomes
        if outcomes is not None:
            outcomes.record(lifecycle, self.path, body)
        window = front.window
        if window is not None:
            if not self._first_seen:  # a whole response: its first token came with its end
                self._tell_first_token()
            address = lifecycle.response.endpoint.address
            pool = front.director.pool
            if address in pool:
                window.answered(
                    lifecycle, pool.value(address, "waiting"), pool.value(address, "running"), body
                )
        trace = self.trace
        if trace is not None:
            status = lifecycle.response.status
            trace.set({TERMINATION_ATTRIBUTE: cause.value})
            trace.end_upstream(status, detail or None, outcome_attributes(lifecycle))
            trace.end(status)

    def failed(self, cause: Termination, detail: str, phase: str) -> None:
        """This attempt failed before any byte reached the client: its endpoint is tried, and a new
        ``pick`` may go elsewhere. ``phase`` labels the failure metric (connect, timeout, invalid, ...)."""
        lifecycle = self.lifecycle
        assert lifecycle is not None
        lifecycle.end(cause, detail=detail)
        address = lifecycle.target.address
        self.tried.append(address)
        if self.front.metrics is not None:
            self.front.metrics.upstream_failures.labels(address, phase).inc()
        if self.trace is not None:
            attributes = {"slorouter.failure_phase": phase, TERMINATION_ATTRIBUTE: cause.value}
            self.trace.end_upstream(None, detail, attributes)

    def abandoned(self, cause: Termination, detail: str) -> None:
        """The request ends without its response reaching the client: the client left
        (``CLIENT_GONE``, counted), or the router stopped it. A request already over is left alone."""
        if self._over:
            return
        self._over = True
        self.admission.release()
        self._drop_copy(detail)
        metrics = self.front.metrics
        if cause is Termination.CLIENT_GONE and metrics is not None and self.request is not None:
            metrics.client_disconnects.inc()
        lifecycle = self.lifecycle
        if lifecycle is not None:
            lifecycle.end(cause, detail=detail)
        if self.trace is not None:
            self.trace.set({TERMINATION_ATTRIBUTE: cause.value})
            self.trace.end(None, detail)

    def refuse(self, status: int, message: str) -> None:
        """The router answers the request itself (an error: bad request, shed, no endpoint, every attempt
        failed): counted by the endpoint last tried (or none), recorded, its span ended."""
        if self._over:
            return
        self._over = True
        self.admission.release()
        self._drop_copy(message)
        front = self.front
        address = self.tried[-1] if self.tried else None
        if front.metrics is not None:
            front.metrics.count_request(address or "none", status)
        if front.traffic is not None and self.request is not None:
            front.traffic.unanswered(self.request, self.path, status, address)
        if self.trace is not None:  # a client's error is not the server span's (OpenTelemetry's rule)
            self.trace.end(status, message if status >= 500 else None)

    @property
    def reads_body(self) -> bool:
        """Whether the response body is read on the way (after ``started``)."""
        return self._observer is not None or self._kept is not None

    # --- internals -----------------------------------------------------------------------------------
    def _count_violation(self, kind: str) -> None:
        """A request cut at its deadline missed that SLO (the latency plugins see no outcome of it)."""
        metrics = self.front.director.latency_metrics
        request = self.request
        if metrics is None or request is None:
            return
        labels = metrics.model_labels(request.model, request.target_model)
        counter = metrics.ttft_slo_violations if kind == "ttft" else metrics.tpot_slo_violations
        counter.labels(*labels).inc()

    def _drop_copy(self, detail: str) -> None:
        """The request ended before its hedge was decided: a copy still racing ends too (counted). A hedge the
        data plane was armed for counts as sent once it was due (the data plane cancels both copies)."""
        plan, actions = self.plan, self.front.actions
        due = self.hedge_due
        if due is not None:
            self.hedge_due = None
            assert plan is not None and actions is not None
            if self.front.director.clock.now() < due:
                actions.hedge_not_sent()
            else:
                actions.hedge_ended(plan, HedgeOutcome.SENT)
                actions.hedge_ended(plan, HedgeOutcome.CANCELLED)
            return
        if not self.hedge_pending:
            return
        self._hedge_settled = True
        copy = self.copy
        self.copy = None
        if copy is not None:
            copy.end(Termination.CANCELLED, detail=detail)
        if plan is not None and actions is not None:
            actions.hedge_ended(plan, HedgeOutcome.CANCELLED)

    def _excluded(self, exclude: Collection[str]) -> Collection[str]:
        if not self.tried:
            return exclude
        return [*exclude, *self.tried] if exclude else self.tried

    def _begin_schedule(self) -> None:
        if self.trace is not None:
            self.trace.begin_schedule({"slorouter.attempt": len(self.tried) + 1})

    def _schedule_failed(self, exc: SchedulingError) -> None:
        if self.trace is not None:
            self.trace.end_schedule(error=exc.message)
        self.admission.release()  # the room reserved for it goes back

    def _dispatch(self, lifecycle: RequestLifecycle) -> RequestLifecycle:
        front = self.front
        window = front.window
        if window is not None and not self.tried:
            window.picked(lifecycle.request.received_at)
        self.lifecycle = lifecycle
        self._observer = None
        self._kept = None
        facts = self.facts = RoutingFacts.of(lifecycle, front.scores_listed)
        record = lifecycle.result.record
        ledger = None if front.audit is None else front.audit.regret
        if ledger is not None and record is not None and not self.tried:
            self.regret = ledger.observe(record)
        if self.trace is not None:
            pick = facts.span_attributes()
            if self.regret is not None:
                pick.update(regret_attributes(self.regret))
            self.trace.end_schedule(pick)
            self.trace.set(pick)
        return lifecycle
