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
from collections.abc import Awaitable, Collection
from typing import Any

import numpy as np

from slorouter.api.replies import history_text
from slorouter.clock import Clock
from slorouter.metrics import LatencyMetrics
from slorouter.pool.inflight import InFlightHandle, InFlightTracker
from slorouter.pool.state import Endpoint, PoolState
from slorouter.scheduling.datakeys import PREDICTION_FALLBACK_STATE
from slorouter.scheduling.loader import SchedulerSetup
from slorouter.scheduling.plugin import DataProducer, ResponseInfo, TargetPrediction
from slorouter.scheduling.types import (
    AdmissionDeniedError,
    Candidates,
    InferenceRequest,
    NoCandidatesError,
    Route,
    SchedulingResult,
)

log = logging.getLogger(__name__)


class Director:
    def __init__(
        self,
        pool: PoolState,
        setup: SchedulerSetup,
        tracker: InFlightTracker,
        clock: Clock,
        *,
        latency_metrics: LatencyMetrics | None = None,
    ) -> None:
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

    async def schedule_async(
        self, request: InferenceRequest, exclude: Collection[str] = ()
    ) -> SchedulingResult:
        """Pick the endpoint(s) for a request; raises ``SchedulingError`` (with its HTTP status).

        The data producers share one time budget (``SchedulerSetup.data_producer_timeout_s``): a producer
        that waits on I/O is awaited for what is left of it, in dependency order, and past it scheduling goes
        on without that producer's data (and without the producers not yet started).
        """
        candidates = self._candidates_or_raise(exclude)
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
        return self._admit_and_schedule(request, candidates)

    def schedule(self, request: InferenceRequest, exclude: Collection[str] = ()) -> SchedulingResult:
        """``schedule_async`` for front-ends without an event loop (the discrete-event simulator).

        Every producer must finish at once (in-process prediction); one that would wait on I/O is a
        configuration error here.
        """
        candidates = self._candidates_or_raise(exclude)
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
        return self._admit_and_schedule(request, candidates)

    def dispatch(self, request: InferenceRequest, result: SchedulingResult) -> RequestLifecycle:
        """Run the pre-request hooks and account the request as in flight on its target."""
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
        return RequestLifecycle(self, request, result, handle, prediction, reply_chars)

    # --- internals -----------------------------------------------------------------------------------
    def _candidates_or_raise(self, exclude: Collection[str]) -> Candidates:
        candidates = self.candidates(exclude)
        if not len(candidates):
            raise NoCandidatesError(
                "no healthy model-server endpoint is available", headers={"Retry-After": "1"}
            )
        return candidates

    def _admit_and_schedule(self, request: InferenceRequest, candidates: Candidates) -> SchedulingResult:
        metrics = self.latency_metrics
        try:
            for admitter in self.setup.admitters:
                admitter.admit(request, candidates)
        except AdmissionDeniedError:
            if metrics is not None:
                metrics.shed.labels(*metrics.model_labels(request.model, request.target_model)).inc()
            raise
        result = self.setup.scheduler.schedule(request, candidates)
        if metrics is not None and result.route is Route.EXPLORE:
            metrics.explorations.inc()
        return result

    def _skipped(self, producer: DataProducer, why: str) -> None:
        log.warning("data producer %r skipped: %s", producer, why)
        if self.latency_metrics is not None:
            self.latency_metrics.producer_skips.labels(repr(producer)).inc()


def _discard(pending: Awaitable[None]) -> None:
    if inspect.iscoroutine(pending):
        pending.close()  # never started: close it so that it is not reported as never awaited
    elif isinstance(pending, asyncio.Future):
        pending.cancel()


class RequestLifecycle:
    """One dispatched request: feeds response events to the plugins and releases its in-flight load once.

    A front-end reports what it sees of the response: ``on_headers``, then ``on_tokens`` as output tokens
    arrive, ``on_reply_text`` with the start of the reply when ``reply_chars_wanted`` > 0, and
    ``on_complete`` once at the end (also on failure; later calls are ignored).
    """

    __slots__ = ("_director", "_handle", "prediction", "reply_chars_wanted", "request", "response", "result")

    def __init__(
        self,
        director: Director,
        request: InferenceRequest,
        result: SchedulingResult,
        handle: InFlightHandle,
        prediction: TargetPrediction | None,
        reply_chars_wanted: int,
    ) -> None:
        self._director = director
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
    def fallback_reason(self) -> str | None:
        """Why the request went by the fallback (``PREDICTION_FALLBACK_STATE``); None on other routes."""
        if self.result.route is not Route.FALLBACK:
            return None
        reason = self.request.state.get(PREDICTION_FALLBACK_STATE)
        return reason if isinstance(reason, str) else None

    @property
    def finished(self) -> bool:
        return self.response.completed_at is not None

    def served_by(self, address: str) -> bool:
        """The data plane served the request from ``address``, not from the pick (a retry on one of the
        pick's fallbacks): its in-flight load moves there, and so do the response hooks. False (nothing
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
        first = response.first_token_at is None
        if first:
            response.first_token_at = self._director.clock.now()
            self._handle.first_token()
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

    def on_complete(self, usage: dict[str, Any] | None = None, error: str | None = None) -> None:
        """The response ended (successfully or not). Safe to call more than once; only the first counts."""
        if self.finished:
            return
        response = self.response
        now = self._director.clock.now()
        response.completed_at = now
        response.error = error
        if error is None and response.reply_text and self.request.history_form:
            response.history_text = history_text(
                self.request.prompt_text, response.reply_text, self.request.history_form
            )
        if usage is not None:
            response.usage = usage
            completion = usage.get("completion_tokens")
            if isinstance(completion, int) and completion >= response.tokens:
                response.tokens = completion
        start = response.first_token_at is None and error is None
        if start:
            response.first_token_at = now
        self._handle.finish()
        for plugin in self._director.setup.response_body_processors:
            self._call(
                plugin.on_response_body, self.request, response, start_of_stream=start, end_of_stream=True
            )

    @staticmethod
    def _call(fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            log.exception("response plugin hook %r failed", fn)
