"""The request lifecycle, written once.

parse (front-end) → data producers → admitters → scheduler → pre-request hooks → dispatch → response hooks.
The HTTP gateway, the Envoy ext_proc server and the discrete-event benchmark are thin front-ends over this
class. It never touches the network or the event loop: time comes from the injected clock.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import numpy as np

from slorouter.clock import Clock
from slorouter.pool.inflight import InFlightHandle, InFlightTracker
from slorouter.pool.state import Endpoint, PoolState
from slorouter.scheduling.config import SchedulerSetup
from slorouter.scheduling.plugin import ResponseInfo
from slorouter.scheduling.types import (
    Candidates,
    InferenceRequest,
    NoCandidatesError,
    SchedulingResult,
)

log = logging.getLogger(__name__)


class Director:
    def __init__(
        self, pool: PoolState, setup: SchedulerSetup, tracker: InFlightTracker, clock: Clock
    ) -> None:
        self.pool = pool
        self.setup = setup
        self.tracker = tracker
        self.clock = clock

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

        A data producer may return an awaitable (e.g. a remote prediction); it is awaited before the next
        producer runs, so producers still see each other's output in dependency order.
        """
        candidates = self.candidates(exclude)
        if not len(candidates):
            raise NoCandidatesError(
                "no healthy model-server endpoint is available", headers={"Retry-After": "1"}
            )
        for producer in self.setup.data_producers:
            try:
                pending = producer.produce(request, candidates)
                if pending is not None:
                    await pending
            except Exception:
                # A broken producer degrades routing (its signal is missing), never availability.
                log.exception("data producer %r failed; scheduling without its data", producer)
        for admitter in self.setup.admitters:
            admitter.admit(request, candidates)
        return self.setup.scheduler.schedule(request, candidates)

    def schedule(self, request: InferenceRequest, exclude: Collection[str] = ()) -> SchedulingResult:
        """``schedule_async`` for front-ends without an event loop (the discrete-event simulator).

        Works when no producer really waits (in-process prediction); a producer that does is an error.
        """
        coroutine = self.schedule_async(request, exclude)
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value
        coroutine.close()
        raise RuntimeError("a data producer waited on I/O; use schedule_async from an event loop")

    def dispatch(self, request: InferenceRequest, result: SchedulingResult) -> RequestLifecycle:
        """Run the pre-request hooks and account the request as in flight on its target."""
        for plugin in self.setup.pre_request:
            try:
                plugin.pre_request(request, result)
            except Exception:
                log.exception("pre-request plugin %r failed", plugin)
        target = result.target
        prompt_tokens = request.prompt_tokens
        cached = min(max(request.cached_prompt_tokens, 0), prompt_tokens)
        handle = self.tracker.dispatch(target.address, prompt_tokens, request.max_tokens, cached)
        return RequestLifecycle(self, request, result, target, handle)


class RequestLifecycle:
    """One dispatched request: feeds response events to the plugins and releases its in-flight load once."""

    __slots__ = ("_director", "_handle", "request", "response", "result")

    def __init__(
        self,
        director: Director,
        request: InferenceRequest,
        result: SchedulingResult,
        target: Endpoint,
        handle: InFlightHandle,
    ) -> None:
        self._director = director
        self._handle = handle
        self.request = request
        self.result = result
        self.response = ResponseInfo(endpoint=target, dispatched_at=director.clock.now())

    @property
    def finished(self) -> bool:
        return self.response.completed_at is not None

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

    def on_complete(
        self, usage: dict[str, Any] | None = None, error: str | None = None, history_text: str | None = None
    ) -> None:
        """The response ended (successfully or not). Safe to call more than once; only the first counts.

        ``history_text``: the prompt text followed by the reply (see ``ResponseInfo.history_text``).
        """
        if self.finished:
            return
        response = self.response
        now = self._director.clock.now()
        response.completed_at = now
        response.error = error
        if error is None:
            response.history_text = history_text
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
