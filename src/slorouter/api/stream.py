"""Reading an OpenAI response while it is relayed: output tokens, the reply text, and ``usage``.

Every front-end that relays OpenAI responses (the HTTP gateway, later the Envoy ext_proc picker) feeds the
response body through these helpers, which report to a ``ResponseSink``: the Director's request lifecycle.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from slorouter.api.replies import ReplyCollector, reply_from_body

_SSE_EVENT = b"data: "
_SSE_DONE = b"data: [DONE]"
# The ``usage`` event is the last before [DONE]; a tail of this many bytes always holds it whole.
_USAGE_TAIL_BYTES = 4096
# A line longer than this is no SSE event a model server sends; it is not held on to.
_MAX_LINE_BYTES = 1 << 20


class ResponseSink(Protocol):
    """What a response observer reports to (``slorouter.director.RequestLifecycle``)."""

    @property
    def reply_chars_wanted(self) -> int: ...

    def on_tokens(self, count: int = 1) -> None: ...

    def on_reply_text(self, text: str) -> None: ...


class StreamObserver:
    """An SSE response, chunk by chunk, split anywhere: one output token per ``data:`` event (but [DONE]),
    choice 0's text when the sink wants it, and the ``usage`` the server sends at the end."""

    __slots__ = ("_collector", "_partial_line", "_sink", "_tail")

    def __init__(self, sink: ResponseSink, history_form: str) -> None:
        self._sink = sink
        wanted = sink.reply_chars_wanted if history_form else 0
        self._collector = ReplyCollector(history_form, wanted) if wanted > 0 else None
        self._tail = b""
        self._partial_line = b""

    def feed(self, chunk: bytes) -> None:
        # Events are counted on whole lines, so a chunk boundary inside a line (a TCP split) neither hides
        # its event nor counts a "data: [DONE]" split after "data: " as a token.
        lines = self._partial_line + chunk if self._partial_line else chunk
        end = lines.rfind(b"\n") + 1
        self._partial_line = lines[end:] if len(lines) - end <= _MAX_LINE_BYTES else b""
        if end:
            whole = lines[:end] if end < len(lines) else lines
            events = whole.count(_SSE_EVENT) - whole.count(_SSE_DONE)
            if events > 0:
                self._sink.on_tokens(events)
        collector = self._collector
        if collector is not None and not collector.full:
            collector.feed(chunk)
        self._tail = (self._tail + chunk)[-_USAGE_TAIL_BYTES:]

    def finish(self) -> dict[str, Any] | None:
        """Hand the collected reply to the sink; the ``usage`` of the stream's last event that has one."""
        collector = self._collector
        if collector is not None and collector.text:
            self._sink.on_reply_text(collector.text)
        return usage_from_tail(self._tail)


def observe_body(sink: ResponseSink, body: bytes, history_form: str) -> None:
    """A whole (non-streaming) response body: hands choice 0's reply to the sink when it wants it."""
    if not history_form or sink.reply_chars_wanted <= 0:
        return
    reply = reply_from_body(body, history_form)
    if reply:
        sink.on_reply_text(reply)


def usage_from_tail(tail: bytes) -> dict[str, Any] | None:
    """The ``usage`` object of the last SSE event that has one (sent with stream_options.include_usage)."""
    position = tail.rfind(b'"usage"')
    if position < 0:
        return None
    start = tail.rfind(_SSE_EVENT, 0, position)
    if start < 0:
        return None
    end = tail.find(b"\n", position)
    try:
        event = json.loads(tail[start + len(_SSE_EVENT) : end if end >= 0 else None])
    except ValueError:
        return None
    usage = event.get("usage") if isinstance(event, dict) else None
    return usage if isinstance(usage, dict) else None
