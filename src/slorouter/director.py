"""The request lifecycle, written once.

parse (front-end) → data producers → admitters → scheduler → pre-request hooks → dispatch → response hooks.
The HTTP gateway, the Envoy ext_proc server and the discrete-event benchmark are thin front-ends over this
class: they use only the public methods of ``Director`` and ``RequestLifecycle`` and know no plugin by
name. It never touches the network: time comes from the injected clock, and only ``schedule_async`` needs
an event loop (to await producers that wait on I/O).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import numpy as np

from slorouter.api.replies import history_text
from slorouter.clock import Clock
from slorouter.flowcontrol.controller import FlowController, LanePick, Ticket
from slorouter.flowcontrol.types import QUEUED_HEADER, Outcome
from slorouter.metrics import LatencyMetrics
from slorouter.pool.inflight import InFlightHandle, InFlightTracker
from slorouter.pool.state import Endpoint, PoolState
from slorouter.scheduling.loader import SchedulerSetup
from slorouter.scheduling.plugin import DataProducer, ResponseInfo, TargetPrediction, Termination
from slorouter.scheduling.types import (
    DROPPED_REASON_HEADER,
    AdmissionDeniedError,
    Candidates,
    CycleState,
    InferenceRequest,
    NoCandidatesError,
    PickReason,
    Route,
    SchedulingError,
    SchedulingResult,
)

log = logging.getLogger(__name__)


class QueueRejectedError(SchedulingError):
    """Flow control turned the request away (HTTP 429): a queue limit, or evicted while queued."""

    status = 429
    error_type = "rate_limit_exceeded"


class QueueTimeoutError(SchedulingError):
    """The request waited in the flow-control queue longer than its TTL (HTTP 503)."""

    status = 503
    error_type = "service_unavailable"


class Admission:
    """A request let through flow control (or with none configured): dispatch it, or ``release`` it when it
    will not be dispatched after all (scheduling failed), so its reserved room is given back."""

    __slots__ = ("_controller", "ticket")

    def __init__(self, controller: FlowController | None = None, ticket: Ticket | None = None) -> None:
        self._controller = controller
        self.ticket = ticket

    @property
    def queued_s(self) -> float:
        return 0.0 if self.ticket is None else self.ticket.queued_s

    def release(self) -> None:
        if self._controller is not None and self.ticket is not None:
            self._controller.release(self.ticket)

    def served(self, tokens: float) -> None:
        if self._controller is not None and self.ticket is not None:
            self._controller.served(self.ticket, tokens)


NOT_QUEUED = Admission()


class Director:
    def __init__(
        self,
        pool: PoolState,
        setup: SchedulerSetup,
        tracker: InFlightTracker,
        clock: Clock,
        *,
        latency_metrics: LatencyMetrics | None = None,
        flow_control: FlowController | None = None,
        record_picks: bool = False,
    ) -> None:
        self.flow_control = flow_control
        # Each pick keeps a ``PickRecord`` (routing regret, the scores header ask for it): off, none is built.
        self.record_picks = record_picks
        self.pool = pool
        self.setup = setup
        self.tracker = tracker
        self.clock = clock
        self.latency_metrics = latency_metrics
        self.predicts_end_to_end = setup.predicts_end_to_end

    def healthy_endpoints(self) -> list[Endpoint]:
        return Candidates.healthy(self.pool).endpoints

    def candidates(self, exclude: Collection[str] = ()) -> Candidates:
        candidates = Candidates.healthy(self.pool)
        if exclude and len(candidates):
            keep = np.fromiter(
                (e.address not in exclude for e in candidates.endpoints), dtype=bool, count=len(candidates)
            )
            candidates = candidates.subset(keep)
        return candidates

    async def admit_async(self, request: InferenceRequest) -> Admission:
        """Wait in flow control until the pool has room for the request (at once without flow control).

        Raises ``QueueRejectedError`` (429: a limit, or evicted) or ``QueueTimeoutError`` (503: its TTL).
        When the awaiting task is cancelled (the client went away), the request leaves the queue at once.
        Then ``schedule_async`` picks on the load of that moment and ``dispatch`` takes the admission.
        """
        controller = self.flow_control
        if controller is None:
            return NOT_QUEUED
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(_ticket: Ticket) -> None:
            if not future.done():
                future.set_result(None)

        ticket = controller.submit(controller.queued_request(request), settle)
        if ticket.outcome is None and ticket.rejection is None:
            controller.ensure_pump()
            try:
                await future
            except asyncio.CancelledError:
                controller.cancel(ticket)
                raise
        return self.admitted(ticket)

    def admit(self, request: InferenceRequest, on_outcome: Callable[[Ticket], None]) -> Ticket:
        """``admit_async`` for the discrete-event simulator: the ticket is DISPATCHED, rejected, or queued
        (then ``on_outcome`` is called when it leaves the queue; pass the ticket to ``admitted``)."""
        controller = self.flow_control
        assert controller is not None, "no flow control configured"
        return controller.submit(controller.queued_request(request), on_outcome)

    def admitted(self, ticket: Ticket) -> Admission:
        """The admission of a ticket that left flow control; raises for any outcome but DISPATCHED."""
        if ticket.rejection is not None:
            raise QueueRejectedError(ticket.rejection.message, headers=_dropped("queue-full", ticket))
        if ticket.outcome is Outcome.EVICTED:
            if ticket.reason == "slo":
                raise QueueRejectedError(
                    "evicted from the queue: its TTFT SLO can no longer be met",
                    headers=_dropped("slo-unattainable", ticket),
                )
            raise QueueRejectedError(
                "evicted from the queue: room was needed for a request of higher priority",
                headers=_dropped("queue-full", ticket),
            )
        if ticket.outcome is Outcome.EXPIRED:
            raise QueueTimeoutError(
                "the request waited in the queue longer than its time-to-live",
                headers=_dropped("queue-ttl", ticket),
            )
        assert ticket.outcome is Outcome.DISPATCHED, ticket.outcome
        return Admission(self.flow_control, ticket)

    async def schedule_async(
        self, request: InferenceRequest, exclude: Collection[str] = (), admission: Admission = NOT_QUEUED
    ) -> SchedulingResult:
        """Pick the endpoint(s) for a request; raises ``SchedulingError`` (with its HTTP status).

        The data producers share one time budget (``SchedulerSetup.data_producer_timeout_s``): a producer
        that waits on I/O is awaited for what is left of it, in dependency order, and past it scheduling goes
        on without that producer's data (and without the producers not yet started). A request released by
        flow control's priority lane is picked among the endpoints with lane room (``_lane_candidates``).
        """
        healthy = self._candidates_or_raise(exclude)
        candidates = self._lane_candidates(healthy, admission)
        deadline = self.clock.now() + self.setup.data_producer_timeout_s
        for producer in self.setup.data_producers:
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                self._skipped(producer, "the data producers' time budget was spent before it started")
                continue
            try:
                pending = producer.produce(request, candidates)
                if pending is not None:
                    await asyncio.wait_for(pending, remaining)
            except TimeoutError:
                self._skipped(producer, "it did not finish within the data producers' time budget")
            except Exception:
                # A broken producer degrades routing (its signal is missing), never availability.
                log.exception("data producer %r failed; scheduling without its data", producer)
        return self._admit_and_schedule(request, candidates, len(candidates) < len(healthy))

    def schedule(
        self, request: InferenceRequest, exclude: Collection[str] = (), admission: Admission = NOT_QUEUED
    ) -> SchedulingResult:
        """``schedule_async`` for front-ends without an event loop (the discrete-event simulator).

        Every producer must finish at once (in-process prediction); one that would wait on I/O is a
        configuration error here.
        """
        healthy = self._candidates_or_raise(exclude)
        candidates = self._lane_candidates(healthy, admission)
        for producer in self.setup.data_producers:
            try:
                pending = producer.produce(request, candidates)
            except Exception:
                log.exception("data producer %r failed; scheduling without its data", producer)
                continue
            if pending is not None:
                _discard(pending)
                raise RuntimeError(
                    f"data producer {producer!r} waits on I/O; use schedule_async from an event loop"
                )
        return self._admit_and_schedule(request, candidates, len(candidates) < len(healthy))

    def dispatch(
        self, request: InferenceRequest, result: SchedulingResult, admission: Admission = NOT_QUEUED
    ) -> RequestLifecycle:
        """Run the pre-request hooks and account the request as in flight on its target (which ends its
        admission's reservation)."""
        cached = 0
        prediction: TargetPrediction | None = None
        for plugin in self.setup.pre_request:
            try:
                outcome = plugin.pre_request(request, result)
            except Exception:
                log.exception("pre-request plugin %r failed", plugin)
                continue
            if outcome is None:
                continue
            if outcome.cached_prompt_tokens is not None:
                cached = max(cached, outcome.cached_prompt_tokens)
            if prediction is None:
                prediction = outcome.prediction
        reply_chars = 0
        if request.history_form:
            for processor in self.setup.response_body_processors:
                try:
                    reply_chars = max(reply_chars, processor.reply_chars_wanted(request))
                except Exception:
                    log.exception("response plugin %r failed to say how much reply it needs", processor)
        target = result.target
        prompt_tokens = request.prompt_tokens
        handle = self.tracker.dispatch(
            target.address, prompt_tokens, request.max_tokens, min(cached, prompt_tokens)
        )
        lifecycle = RequestLifecycle(self, request, result, handle, prediction, reply_chars, admission)
        admission.release()
        return lifecycle

    # --- internals -----------------------------------------------------------------------------------
    def _candidates_or_raise(self, exclude: Collection[str]) -> Candidates:
        candidates = self.candidates(exclude)
        if not len(candidates):
            raise NoCandidatesError(
                "no healthy model-server endpoint is available", headers={"Retry-After": "1"}
            )
        return candidates

    def _lane_candidates(self, candidates: Candidates, admission: Admission) -> Candidates:
        """A lane ticket's candidates: those with lane room (all of them if none has it), and of those
        only the least loaded with ``LanePick.LEAST_LOADED``."""
        controller = self.flow_control
        ticket = admission.ticket
        if controller is None or ticket is None or not ticket.lane:
            return candidates
        room = controller.detector.lane_mask(candidates.positions)
        if room.any() and not room.all():
            candidates = candidates.subset(room)
        if controller.lane_pick is LanePick.LEAST_LOADED and len(candidates) > 1:
            order = np.lexsort(
                (candidates.column("inflight_prefill_tokens"), candidates.column("inflight_requests"))
            )
            candidates = candidates.subset(order[:1])
        return candidates

    def _admit_and_schedule(
        self, request: InferenceRequest, candidates: Candidates, lane_narrowed: bool
    ) -> SchedulingResult:
        metrics = self.latency_metrics
        try:
            for admitter in self.setup.admitters:
                admitter.admit(request, candidates)
        except AdmissionDeniedError:
            if metrics is not None:
                metrics.shed.labels(*metrics.model_labels(request.model, request.target_model)).inc()
            raise
        result = self.setup.scheduler.schedule(request, candidates, CycleState(record=self.record_picks))
        if metrics is not None and result.route is Route.EXPLORE:
            metrics.explorations.inc()
        record = result.record
        if lane_narrowed and record is not None and record.reason is not PickReason.EXPLORATION:
            record.reason = PickReason.LANE
        return result

    def _skipped(self, producer: DataProducer, why: str) -> None:
        log.warning("data producer %r skipped: %s", producer, why)
        if self.latency_metrics is not None:
            self.latency_metrics.producer_skips.labels(repr(producer)).inc()


def _dropped(reason: str, ticket: Ticket) -> dict[str, str]:
    """The headers of a request flow control turned away: why, and how long it waited."""
    return {
        "Retry-After": "1",
        DROPPED_REASON_HEADER: reason,
        QUEUED_HEADER: f"{ticket.queued_s * 1000:.1f}",
    }


def _discard(pending: Awaitable[None]) -> None:
    if inspect.iscoroutine(pending):
        pending.close()  # never started: close it so that it is not reported as never awaited
    elif isinstance(pending, asyncio.Future):
        pending.cancel()


class RequestLifecycle:
    """One dispatched request: feeds response events to the plugins and releases its in-flight load once.

    A front-end reports what it sees of the response: ``on_headers``, then ``on_tokens`` as output tokens
    arrive, ``on_reply_text`` with the start of the reply when ``reply_chars_wanted`` > 0, and ``end`` once
    with how it ended (also on failure; later calls are ignored).
    """

    __slots__ = (
        "_director",
        "_handle",
        "admission",
        "prediction",
        "reply_chars_wanted",
        "request",
        "response",
        "result",
    )

    def __init__(
        self,
        director: Director,
        request: InferenceRequest,
        result: SchedulingResult,
        handle: InFlightHandle,
        prediction: TargetPrediction | None,
        reply_chars_wanted: int,
        admission: Admission = NOT_QUEUED,
    ) -> None:
        self._director = director
        self.admission = admission
        self._handle = handle
        self.request = request
        self.result = result
        self.prediction = prediction  # the chosen endpoint's predicted latency, when predicted
        # How much of the reply (choice 0's text) the plugins need; 0: the front-end collects none.
        self.reply_chars_wanted = reply_chars_wanted
        self.response = ResponseInfo(endpoint=result.target, dispatched_at=director.clock.now())

    @property
    def target(self) -> Endpoint:
        return self.response.endpoint

    @property
    def route(self) -> Route:
        return self.result.route

    @property
    def queued_s(self) -> float:
        """Time the request waited in flow control before it was scheduled."""
        return self.admission.queued_s

    @property
    def fallback_reason(self) -> str | None:
        """Why the request went by the fallback; None on other routes."""
        return self.result.fallback_reason

    @property
    def finished(self) -> bool:
        return self.response.completed_at is not None

    @property
    def prefill_tokens(self) -> int:
        """The prompt tokens the endpoint was expected to compute (its expected cache hits left out)."""
        return self._handle.prefill_tokens

    def served_by(self, address: str, dispatched_at: float | None = None) -> bool:
        """The data plane served the request from ``address``, not from the pick (a retry on one of the
        pick's fallbacks, or a hedged copy it sent at ``dispatched_at``, from which the endpoint's latency
        is then measured): its in-flight load moves there, and so do the response hooks. False (nothing
        changes) when ``address`` is the target already, or not an endpoint of the pool."""
        if self.finished or address == self.response.endpoint.address:
            return False
        endpoint = self._director.pool.get(address)
        if endpoint is None:
            return False
        self._handle.finish()
        request = self.request
        self._handle = self._director.tracker.dispatch(address, request.prompt_tokens, request.max_tokens)
        self.response.endpoint = endpoint
        if dispatched_at is not None:
            self.response.dispatched_at = dispatched_at
        return True

    def on_headers(self, status: int, streaming: bool) -> None:
        self.response.status = status
        self.response.streaming = streaming
        for plugin in self._director.setup.response_header_processors:
            self._call(plugin.on_response_headers, self.request, self.response)

    def on_tokens(self, count: int = 1) -> None:
        """Output tokens arrived (streaming chunks). The first call marks the first token."""
        if self.finished or count <= 0:
            return
        response = self.response
        director = self._director
        handle = self._handle
        first = response.first_token_at is None
        tracker = director.tracker
        now = director.clock.now() if first or tracker.watches_stalls else 0.0
        if first:
            response.first_token_at = now
            controller = director.flow_control
            if controller is not None and not handle.finished:
                controller.detector.observe_first_token(
                    handle.address, handle.prefill_ahead, now - response.dispatched_at
                )
            handle.first_token()
            self._room_changed()
        if tracker.watches_stalls:  # hedging around stalls: the endpoint's progress, chunk by chunk
            tracker.progressed(handle.address, now)
        response.tokens += count
        for plugin in self._director.setup.response_body_processors:
            self._call(
                plugin.on_response_body, self.request, response, start_of_stream=first, end_of_stream=False
            )

    def on_reply_text(self, text: str) -> None:
        """More of the reply's text (choice 0), in order; ignored unless ``reply_chars_wanted`` > 0."""
        if self.finished or not text or self.reply_chars_wanted <= 0:
            return
        response = self.response
        response.reply_text = text if response.reply_text is None else response.reply_text + text

    def end(
        self,
        cause: Termination = Termination.COMPLETE,
        *,
        usage: dict[str, Any] | None = None,
        detail: str = "",
    ) -> None:
        """The response ended: whole (``COMPLETE``, with the server's ``usage`` when it sent one), or not
        (``cause``, and in ``detail`` what the front-end saw, for logs and spans). Safe to call more than
        once; only the first call counts."""
        if self.finished:
            return
        response = self.response
        now = self._director.clock.now()
        response.completed_at = now
        response.cause = cause
        response.detail = detail
        succeeded = response.succeeded
        if succeeded and response.reply_text and self.request.history_form:
            response.history_text = history_text(
                self.request.prompt_text, response.reply_text, self.request.history_form
            )
        if usage is not None:
            response.usage = usage
            completion = usage.get("completion_tokens")
            # The server's own count wins over the events counted: a stream also has events that carry no
            # token (a chat stream's role event, a closing event with only finish_reason, the usage event).
            if isinstance(completion, int) and not isinstance(completion, bool) and completion >= 0:
                response.tokens = completion
        start = response.first_token_at is None and succeeded
        if start:
            response.first_token_at = now
        self._handle.finish()
        self.admission.served(2 * response.tokens)  # the original weighs output tokens 2x
        self._room_changed()
        for plugin in self._director.setup.response_body_processors:
            self._call(
                plugin.on_response_body, self.request, response, start_of_stream=start, end_of_stream=True
            )

    def _room_changed(self) -> None:
        controller = self._director.flow_control
        if controller is not None and len(controller):
            controller.service()  # work-conserving: a freed slot takes the next queued request now

    @staticmethod
    def _call(fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            log.exception("response plugin hook %r failed", fn)
