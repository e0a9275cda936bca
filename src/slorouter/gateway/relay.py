"""Relaying one dispatched request to its endpoint and the response back to the client.

The request body goes upstream as the exchange gives it for the endpoint (the client's, with the request's
priority in the engine's form when ``pool.engine_priority`` is on); the response comes back chunk by chunk,
fed to the request's ``Exchange`` on the way (tokens, reply text, usage, how it ended). An upstream that
fails before any byte reached the client raises ``UpstreamFailedError`` (its status for the client, and
whether another endpoint may be tried); one that fails mid-stream ends the client's stream with an
OpenAI-style error event and ``data: [DONE]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from slorouter.http.errors import SSE_DONE, sse_error_event
from slorouter.http.headers import HOP_BY_HOP, forwarded_lines
from slorouter.http.server import HttpRequest, Response
from slorouter.http.upstream import (
    UpstreamBodyTooLargeError,
    UpstreamClient,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeoutError,
)
from slorouter.metrics import GatewayMetrics
from slorouter.scheduling.plugin import Termination
from slorouter.serving.exchange import Exchange
from slorouter.serving.slo_actions import DEADLINE_EXCEEDED

# Hop-by-hop headers and those computed per hop are never copied across (nor those Connection names).
NOT_FORWARDED = HOP_BY_HOP | {
    b"host",
    b"content-length",
    b"expect",  # answered by the gateway's server; the body is sent whole upstream
}
# The gateway's server writes its own Date; the upstream's would be a duplicate.
_NOT_RETURNED = NOT_FORWARDED | {b"date"}
_HOLD_BYTES = 1 << 20  # a first event longer than this is relayed before it is whole
# How an SSE body may begin (a field name or a comment), after optional blank lines.
_SSE_STARTS = (b"data:", b":", b"event:", b"id:", b"retry:")


@dataclass(slots=True)
class Opened:
    """An upstream answer that has begun (``Relay.open``): ``data`` is a stream's first event, or the
    whole body of any other answer."""

    upstream: UpstreamResponse
    address: str
    streaming: bool
    data: bytes


class UpstreamFailedError(Exception):
    """The upstream failed before any byte reached the client.

    ``status`` is what the client gets if no other endpoint answers (502, or 504 when a timeout expired);
    ``retryable`` whether another endpoint may be tried (not after a timeout: the client waited long
    enough); ``phase`` labels the failure metric (``connect``, ``timeout``, ``invalid``, ``too-large``).
    """

    def __init__(self, message: str, *, status: int = 502, retryable: bool = True, phase: str = "connect"):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.phase = phase

    @property
    def cause(self) -> Termination:
        return Termination.UPSTREAM_TIMEOUT if self.status == 504 else Termination.UPSTREAM_ERROR


def _failed(address: str, exc: UpstreamError) -> UpstreamFailedError:
    message = f"{address}: {exc.__class__.__name__}: {exc}"
    if isinstance(exc, UpstreamTimeoutError):
        return UpstreamFailedError(message, status=504, retryable=False, phase="timeout")
    if isinstance(exc, UpstreamBodyTooLargeError):
        return UpstreamFailedError(message, retryable=False, phase="too-large")
    return UpstreamFailedError(message, phase="connect")


_WHITE = frozenset(b" \t\r\n")


def looks_like_json(body: bytes) -> bool:
    """A cheap shape check of a JSON object body (no parse, no copy): ``{`` ... ``}`` around optional white
    space."""
    start, end = 0, len(body)
    while start < end and body[start] in _WHITE:
        start += 1
    while end > start and body[end - 1] in _WHITE:
        end -= 1
    return end - start >= 2 and body[start] == 0x7B and body[end - 1] == 0x7D  # { }


def looks_like_sse(first: bytes) -> bool:
    """Whether an SSE body may begin with ``first`` (only the first event is checked)."""
    start = 0
    while start < len(first) and first[start] in (0x0D, 0x0A):  # blank lines
        start += 1
    head = first[start : start + 6]
    if not head:
        return True  # blank lines only: nothing to judge yet
    return any(head.startswith(prefix) or prefix.startswith(head) for prefix in _SSE_STARTS)


class Relay:
    """Proxies dispatched requests over one pooled upstream client."""

    def __init__(
        self, client: UpstreamClient, metrics: GatewayMetrics, *, max_body_bytes: int | None = None
    ) -> None:
        self._client = client
        self._max_body_bytes = max_body_bytes
        self._metrics = metrics
        self._fixed_lines: dict[tuple[str, str, str | None], bytes] = {}

    async def relay(
        self, http: HttpRequest, exchange: Exchange, body: bytes, forward_head: bytes
    ) -> Response | None:
        """The response (None when it was streamed to the client). Raises ``UpstreamFailedError``."""
        lifecycle = exchange.lifecycle
        assert lifecycle is not None
        opened = await self.open(lifecycle.target.address, exchange.path, forward_head, body)
        return await self.deliver(http, exchange, opened)

    async def open(self, address: str, path: str, forward_head: bytes, body: bytes) -> Opened:
        """Send the request and wait for its answer to begin: a stream's first whole event (or
        ``_HOLD_BYTES`` of it), or a whole body. Nothing has reached the client yet, so a failure here can
        still be retried elsewhere, and two copies of a request can race to this point. Raises
        ``UpstreamFailedError``; a cancelled open closes its connection (the server stops the request)."""
        try:
            upstream = await self._client.request(address, "POST", path, forward_head, body)
        except UpstreamError as exc:
            raise _failed(address, exc) from exc
        try:
            streaming = "text/event-stream" in (upstream.header(b"content-type") or "")
            if streaming and upstream.status == 200:
                first = await self._first_event(upstream, address)
                return Opened(upstream, address, True, first)
            whole = await self._whole(upstream, address)
            return Opened(upstream, address, streaming, whole)
        except BaseException:
            upstream.release()
            raise

    async def deliver(self, http: HttpRequest, exchange: Exchange, opened: Opened) -> Response | None:
        """Relay an opened answer to the client (None when streamed)."""
        upstream = opened.upstream
        try:
            exchange.started(upstream.status, opened.streaming, keeps_body=False)
            if opened.streaming and upstream.status == 200:
                await self._relay_stream(http, exchange, opened)
                return None
            exchange.answered(body=opened.data)
            return Response(upstream.status, opened.data, raw_headers=self._response_head(upstream, exchange))
        finally:
            upstream.release()

    async def _whole(self, upstream: UpstreamResponse, address: str) -> bytes:
        try:
            body = await upstream.read(self._max_body_bytes)
        except UpstreamError as exc:
            raise _failed(address, exc) from exc
        if upstream.status < 300 and not looks_like_json(body):
            message = f"{address}: answered {upstream.status} with a body that is not a JSON object"
            raise UpstreamFailedError(message, phase="invalid")
        return body

    async def _first_event(self, upstream: UpstreamResponse, address: str) -> bytes:
        # The client's headers are held back until the first whole event arrives (or _HOLD_BYTES of it), so
        # that an upstream that dies before sending one can still be retried elsewhere.
        first = b""
        try:
            while True:
                chunk = await upstream.next_chunk()
                first += chunk
                if not chunk or b"\n\n" in first or b"\r\n\r\n" in first or len(first) >= _HOLD_BYTES:
                    break
        except UpstreamError as exc:
            raise _failed(address, exc) from exc
        if not chunk:
            what = "anything" if not first else "a whole event"
            raise UpstreamFailedError(f"{address}: closed the stream before sending {what}")
        if not looks_like_sse(first):
            raise UpstreamFailedError(f"{address}: answered a stream that is not SSE", phase="invalid")
        return first

    async def _relay_stream(self, http: HttpRequest, exchange: Exchange, opened: Opened) -> None:
        upstream, address = opened.upstream, opened.address
        chunk = opened.data
        judged = exchange.plan is not None  # only a plan can cut a stream for its TPOT
        try:
            writer = await http.start_stream(upstream.status, self._response_head(upstream, exchange))
            while chunk:
                exchange.chunk(chunk)
                await writer.write(chunk)
                if judged:
                    overrun = exchange.tpot_overrun()
                    if overrun is not None:
                        await writer.write(sse_error_event(504, overrun, DEADLINE_EXCEEDED) + SSE_DONE)
                        break
                try:
                    chunk = await upstream.next_chunk()
                except UpstreamError as exc:
                    self._metrics.upstream_failures.labels(address, "stream").inc()
                    if isinstance(exc, UpstreamTimeoutError):
                        exchange.answered(Termination.UPSTREAM_TIMEOUT, f"stream: {exc.__class__.__name__}")
                        event = sse_error_event(
                            504, f"the model server {address} timed out mid-stream ({exc})"
                        )
                    else:
                        exchange.answered(Termination.UPSTREAM_ERROR, f"stream: {exc.__class__.__name__}")
                        event = sse_error_event(502, f"the model server {address} failed mid-stream")
                    # The event is OpenAI's error shape; [DONE] tells a client's SDK the stream is over.
                    await writer.write(event + SSE_DONE)
                    break
            exchange.answered()  # a no-op after a failure mid-stream
            await writer.write_eof()
        except ConnectionResetError:
            exchange.abandoned(Termination.CLIENT_GONE, "client disconnected")

    def _response_head(self, upstream: UpstreamResponse, exchange: Exchange) -> bytes:
        """The upstream's end-to-end headers, then the gateway's own, as preformatted lines."""
        assert exchange.facts is not None
        return upstream_headers(upstream) + exchange.facts.head_lines(self._fixed_lines)


def upstream_headers(upstream: UpstreamResponse) -> bytes:
    """The upstream's end-to-end response headers, preformatted."""
    return forwarded_lines(upstream.headers, _NOT_RETURNED)
