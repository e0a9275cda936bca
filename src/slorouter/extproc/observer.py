"""The observed response path: a data plane whose picking filter skips the response streams it, in
observability mode (nothing it sends is answered), on a second ext_proc stream. A ``ResponseObserver`` claims
the request the picker routed by the key the pick left in the ``slorouter`` dynamic metadata, and feeds the
response to that request's ``PickerStream``; the ``ObservationQueue`` applies observations after the picks
that arrived with them, so no exchange with the picker is left on the response's path.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slorouter.extproc import messages
from slorouter.extproc.messages import ProtocolError

if TYPE_CHECKING:
    from slorouter.extproc.stream import Picker, PickerStream

log = logging.getLogger(__name__)

Response = Any  # an envoy.service.ext_proc.v3.ProcessingResponse (the generated modules are untyped)


class ResponseObserver:
    """A data plane's observing stream (observability mode: nothing it is sent is answered): a request the
    picker routed on another stream, claimed at its request headers by the key the pick left in the
    ``slorouter`` metadata, its response fed to that request's hooks; the stream's end (the HTTP stream's)
    ends a request whose response did not."""

    def __init__(self, picker: Picker) -> None:
        self._picker = picker
        self._owner: PickerStream | None = None
        # Nothing more to observe (the response ended, or it is not a request of this picker's): the RPC
        # ends, and the data plane stops sending.
        self.closed = False

    def step(self, message: Any) -> list[Response]:
        owner = self._owner
        if owner is None:
            owner = self._claim(message)
            if owner is None:
                self.closed = True
                return []
        if message.WhichOneof("request") in _OBSERVED_KINDS:
            self._picker.observations.add(_observe, owner, message)
        return []

    def _claim(self, message: Any) -> PickerStream | None:
        key = messages.observation_key(message)
        if key is None:  # a response the picker did not route (a local reply, GET /v1/models)
            return None
        owner = self._picker.awaiting_observer.pop(key, None)
        if owner is None:
            # Routed by another process (several pickers behind one data plane connection pool), or given
            # up on already: its hooks cannot be fed from here.
            self._picker.metrics.unmatched_observations.inc()
            return None
        owner.claimed_by_observer()
        self._owner = owner
        return owner

    def close(self, reason: str) -> None:
        owner = self._owner
        if owner is not None:
            self._picker.observations.add(_abandon_unless_observed, owner, reason)
        self.closed = True


_OBSERVED_KINDS = frozenset(("response_headers", "response_body", "response_trailers"))


def _observe(owner: PickerStream, message: Any) -> None:
    kind = message.WhichOneof("request")
    try:
        if kind == "response_headers":
            owner.observe_response_headers(message)
        elif kind == "response_body":
            owner.observe_response_body(message.response_body.body, message.response_body.end_of_stream)
        else:
            owner.observe_response_body(b"", True)
    except ProtocolError as exc:
        log.warning("ext_proc observer: %s", exc)
        owner.abandon(f"ext_proc protocol error: {exc}")


def _abandon_unless_observed(owner: PickerStream, reason: str) -> None:
    if not owner.response_observed:
        owner.abandon(reason)


class ObservationQueue:
    """Observed responses applied after the picks read with them.

    An observation reaches the picker as the client gets the response, so the client's next request often
    comes in the same read: routing it first keeps the completion hooks (training samples, the load-latency
    fit) off its path. The queue is drained once per turn of the event loop, in arrival order."""

    __slots__ = ("_queue", "_scheduled")

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._scheduled = False

    def add(self, apply: Callable[..., None], *args: Any) -> None:
        self._queue.append((apply, args))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        queue = self._queue
        while queue:
            apply, args = queue.popleft()
            try:
                apply(*args)
            except Exception:
                log.exception("applying an observed response failed")
