"""A lean HTTP/1.1 server: asyncio.Protocol + httptools (llhttp).

aiohttp's web server costs more CPU per request than the gateway's proxying itself; the servers here need
little of it: a fixed route table, whole request bodies up to a limit, plain responses and chunked streaming
responses with back-pressure, keep-alive and pipelining, and the handler cancelled when its client goes
away. Slow or greedy clients are bounded by ``ServerLimits``: a deadline for the request head, a longest
pause within a body, an idle keep-alive timeout, a longest time without reading the answer, the size of a
request head and target, caps on connections, on requests handled at once, on requests read ahead on one
connection, and on the body bytes held across all connections. Each time a limit turns a client away,
``HttpServer.on_limit`` is told its name.

Handlers are ``async def handler(request: HttpRequest) -> Response | None``; a handler that streamed its
answer through ``request.start_stream`` returns None (or the ``Response`` it got is ignored).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

import httptools

from slorouter.http.errors import error_body

log = logging.getLogger(__name__)

Handler = Callable[["HttpRequest"], Awaitable["Response | None"]]

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}
_JSON = b"application/json"

# After an error answer, how long the connection is kept open (reading and dropping what the client still
# sends) so that closing it with unread bytes does not reset it before the client has read the answer.
LINGER_S = 2.0


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """How long and how much a client may take. Timeouts are in seconds."""

    head_timeout_s: float = 10.0  # a request head must be complete this long after its first byte (408)
    body_timeout_s: float = 30.0  # longest pause between bytes of a request body (408)
    keepalive_timeout_s: float = 75.0  # an idle connection, between requests, is closed after this
    send_timeout_s: float = 60.0  # a client that reads none of its answer this long is dropped
    max_connections: int = 4096  # connections beyond it get 503 and are closed
    max_buffered_bytes: int = 512 * 1024 * 1024  # request-body bytes held across all connections (503)
    max_head_bytes: int = 64 * 1024  # request line and header fields of one request (431)
    max_header_fields: int = 200  # header fields of one request (431)
    # A longer request target gets 414 (RFC 9112 §3); 8 KiB is nginx's and Apache's request-line bound.
    max_target_bytes: int = 8 * 1024
    max_pipelined: int = 64  # requests read on one connection ahead of the one being answered (503, close)
    max_concurrent_requests: int = 4096  # handled at once across connections, unbounded routes aside (503)

    def __post_init__(self) -> None:
        for name in ("head_timeout_s", "body_timeout_s", "keepalive_timeout_s", "send_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        for name in (
            "max_connections",
            "max_buffered_bytes",
            "max_head_bytes",
            "max_header_fields",
            "max_target_bytes",
            "max_pipelined",
            "max_concurrent_requests",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))
    return line


class _DateCache:
    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = 0
        self._value = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._value


_date = _DateCache()


def format_headers(headers: Iterable[tuple[str, str]]) -> bytes:
    """``Name: value\\r\\n`` lines; ``ValueError`` if a name or value holds CR or LF.

    Raised, not replaced: such a value would split the head; it is a bug or an injection attempt, and a 500
    is safer than a guess at what was meant."""
    lines = []
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"response header {name!r} holds CR or LF")
        lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
    return b"".join(lines)


def check_header_lines(raw: bytes) -> None:
    """``ValueError`` unless ``raw`` is whole ``Name: value\\r\\n`` lines with no CR or LF elsewhere."""
    lines = raw.count(b"\r\n")
    if (
        raw.count(b"\r") != lines
        or raw.count(b"\n") != lines
        or (raw and (raw[-2:] != b"\r\n" or raw[:2] == b"\r\n" or b"\r\n\r\n" in raw))
    ):
        raise ValueError("preformatted response headers hold a bare CR or LF, or an empty line")


class Response:
    """A whole response; ``raw_headers`` are preformatted ``Name: value\\r\\n`` lines."""

    __slots__ = ("body", "content_type", "headers", "raw_headers", "status")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        *,
        headers: dict[str, str] | None = None,
        content_type: bytes | None = None,
        raw_headers: bytes = b"",
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.content_type = content_type
        self.raw_headers = raw_headers


def json_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """An OpenAI-style JSON error response."""
    return Response(
        status, error_body(status, message, param=param, code=code), headers=headers, content_type=_JSON
    )


def json_response(body: bytes, status: int = 200) -> Response:
    return Response(status, body, content_type=_JSON)


class HttpRequest:
    """One parsed request. ``headers`` are raw (name, value) pairs; ``header()`` looks one up."""

    __slots__ = (
        "_proto",
        "_stream",
        "body",
        "headers",
        "http10",
        "keep_alive",
        "method",
        "path",
        "query",
        "too_large",
    )

    def __init__(self, proto: _HttpProtocol, method: str, target: bytes, headers: list[tuple[bytes, bytes]]):
        self._proto = proto
        self._stream: StreamWriter | None = None
        self.method = method
        if target[:1] != b"/" and b"://" in target:
            target = _origin_form(target)
        path, _, query = target.partition(b"?")
        self.path = path.decode("utf-8", "surrogateescape")
        self.query = query
        self.headers = headers
        self.body = b""
        self.keep_alive = True
        self.http10 = False
        self.too_large = False

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (give it in lower case)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def max_body_bytes(self) -> int:
        return self._proto.server.max_body_bytes

    async def start_stream(self, status: int, raw_headers: bytes) -> StreamWriter:
        """Send the status and headers of a chunked response; returns the writer of its body."""
        check_header_lines(raw_headers)
        if self.http10:
            self.keep_alive = False  # no chunked encoding in HTTP/1.0: the end of the body is the close
        writer = self._stream = StreamWriter(self._proto, self.keep_alive, chunked=not self.http10)
        writer.start(status, raw_headers)
        return writer

    def write_raw(self, data: bytes) -> None:
        """Send bytes as they are, outside any framing (fault injection: a response cut short)."""
        self._proto.send(data)

    def abort_connection(self) -> None:
        """Reset the client's connection at once (fault injection: a server killed mid-response)."""
        self._proto._abort()


def _origin_form(target: bytes) -> bytes:
    """The path and query of an absolute-form target, which a server MUST accept (RFC 9112 §3.2.2)."""
    rest = target.partition(b"://")[2]
    end = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i != -1), default=len(rest))
    path = rest[end:]
    return path if path[:1] == b"/" else b"/" + path


class StreamWriter:
    """The body of a chunked response. ``write`` raises ConnectionResetError once the client is gone."""

    __slots__ = ("_chunked", "_keep_alive", "_proto", "finished")

    def __init__(self, proto: _HttpProtocol, keep_alive: bool, chunked: bool = True) -> None:
        self._proto = proto
        self._keep_alive = keep_alive
        self._chunked = chunked
        self.finished = False

    def start(self, status: int, raw_headers: bytes) -> None:
        connection = b"" if self._keep_alive else b"Connection: close\r\n"
        framing = b"Transfer-Encoding: chunked\r\n" if self._chunked else b""
        extra = self._proto.server.extra_headers
        self._proto.send(
            b"%s%s%s%s%s%s\r\n" % (_status_line(status), _date.get(), raw_headers, extra, framing, connection)
        )

    async def write(self, data: bytes) -> None:
        if not data:
            return
        proto = self._proto
        proto.send(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        if proto.write_paused:
            await proto.drain()

    async def write_eof(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self._chunked:
            self._proto.send(b"0\r\n\r\n")
        if self._proto.write_paused:
            await self._proto.drain()


class _Reject(Exception):
    """Raised inside a parser callback: the request is answered with this error and the connection closed.
    ``limit`` names the ``ServerLimits`` bound that the request hit, if any."""

    def __init__(self, status: int, message: str, headers: bytes = b"", limit: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.limit = limit


_RETRY_LATER = b"Retry-After: 1\r\n"

# Body pieces shorter than this, after the first, are copied into one buffer (see ``on_body``).
_SMALL_PIECE = 4096

# What the parser is reading: nothing (between requests), a request head, a request body.
_IDLE, _HEAD, _BODY = 0, 1, 2


class _HttpProtocol(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.write_paused = False
        self._write_paused_at = 0.0  # loop time of the last pause_writing
        self._reading_paused = False
        # Clocks of the timeouts (loop time): the last response or connect, the current head's first byte,
        # the last bytes received. The sweep compares them with the limits while no response is under way.
        self.last_active = 0.0
        self._head_started = 0.0
        self._last_data = 0.0
        self._phase = _IDLE
        self._drain_waiter: asyncio.Future[None] | None = None
        self._url = b""
        self._head_size = 0  # bytes of the current head's parsed request line and header fields
        self._head_raw = 0  # bytes of the data chunks read wholly inside the current head
        self._messages = 0  # heads begun on this connection
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes | bytearray] = []
        self._body_size = 0
        self._too_large = False
        self._held = 0  # request-body bytes of this connection counted in ``server.buffered``
        self._continue_due = False  # the request being read wants 100 Continue once it is its turn
        self._upgrade_head = b""  # the current head without its Upgrade offer, to parse again
        self._deferred: _Reject | None = None  # an error to answer once the responses before it are out
        self._discarding = False  # an error answer went out: what the client still sends is dropped
        self._pending: collections.deque[HttpRequest] = collections.deque()
        self._task: asyncio.Task[None] | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though uvloop's TCPTransport does not subclass asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        self.last_active = self._last_data = self.loop.time()
        # asyncio and uvloop set TCP_NODELAY on TCP transports themselves.
        connections = self.server.connections
        connections.add(self)
        limit = self.server.limits.max_connections
        if len(connections) > limit:
            self.server.limit_hit("connections")
            self._answer_error(_Reject(503, f"too many connections (the limit is {limit})", _RETRY_LATER))

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        self._last_data = self.loop.time()
        in_head = self._phase == _HEAD
        messages = self._messages
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._reparse_without_upgrade(data[exc.args[0] :])
        except httptools.HttpParserCallbackError as exc:
            reason = exc.__context__
            if isinstance(reason, _Reject):
                self._fail(reason)
            else:
                self._fail(_Reject(400, f"malformed HTTP request: {exc}"))
        except httptools.HttpParserError as exc:
            self._fail(_Reject(400, f"malformed HTTP request: {exc}"))
        else:
            if in_head and self._phase == _HEAD and self._messages == messages:
                # The whole chunk is inside one head. httptools keeps a header field's name and value to
                # itself until the field ends, so the callbacks alone cannot bound one endless field.
                self._head_raw += len(data)
                if self._head_raw > self.server.limits.max_head_bytes:
                    self._fail(self._head_too_large())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.server.buffered -= self._held
        self._held = 0
        self._pending.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client went away: so does its request
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self.write_paused = True
        self._write_paused_at = self.loop.time()

    def resume_writing(self) -> None:
        self.write_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- httptools callbacks -------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._phase = _HEAD
        self._head_started = self._last_data
        self._url = b""
        self._head_size = 0
        self._head_raw = 0
        self._messages += 1
        self._headers = []
        self._body = []
        self._body_size = 0
        self._too_large = False
        self._upgrade_head = b""

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        limit = self.server.limits.max_target_bytes
        if len(self._url) > limit:
            raise _Reject(414, f"the request target exceeds {limit} bytes", limit="target_bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._head_size += len(name) + len(value) + 4
        limits = self.server.limits
        if self._head_size > limits.max_head_bytes or len(self._headers) > limits.max_header_fields:
            raise self._head_too_large()

    def _head_too_large(self) -> _Reject:
        limits = self.server.limits
        message = (
            f"the request line and headers exceed {limits.max_head_bytes} bytes "
            f"or {limits.max_header_fields} fields"
        )
        return _Reject(431, message, limit="head_bytes")

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        parser = self.parser
        if parser.should_upgrade():
            self._note_upgrade_offer()
            return  # the head is parsed again without the offer; that pass does the rest
        expect_continue = False
        hosts = 0
        codings: list[bytes] = []
        for name, value in self._headers:
            lower = name.lower()
            if lower == b"content-length":
                if value.strip().isdigit():
                    self._too_large = int(value) > self.server.max_body_bytes
            elif lower == b"host":
                hosts += 1
            elif lower == b"transfer-encoding":
                codings.extend(c.strip().lower() for c in value.split(b",") if c.strip())
            elif lower == b"expect":
                expect_continue = value.lower() == b"100-continue"
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":  # llhttp takes HTTP/0.9 and HTTP/2.0 request lines too
            raise _Reject(505, "only HTTP/1.1 and HTTP/1.0 are supported")
        http10 = version == "1.0"
        if hosts > 1 or (hosts == 0 and not http10):
            # RFC 9112 §3.2: MUST be 400; two Host lines are a classic way to make two servers disagree.
            message = "more than one Host header" if hosts else "an HTTP/1.1 request needs a Host header"
            raise _Reject(400, message)
        if codings:
            if http10:
                # RFC 9112 §6.1: MUST be taken as faulty framing (an HTTP/1.0 peer may not know chunked).
                raise _Reject(400, "Transfer-Encoding in an HTTP/1.0 request")
            if codings[-1] != b"chunked":  # RFC 9112 §6.3: the body's length is unknown, MUST be 400
                raise _Reject(400, "the final transfer coding of a request must be chunked")
            if len(codings) > 1:
                # llhttp frames "gzip, chunked" as chunked and would hand the handler gzip bytes.
                raise _Reject(501, "only the chunked transfer coding is implemented")
        if expect_continue and not self._too_large and not http10:
            # curl sends this for bodies over 1 KiB, and otherwise waits a second for the go-ahead. Only the
            # request whose turn it is may get it: otherwise it would land inside an earlier response.
            if self._task is None:
                self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            else:
                self._continue_due = True

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        size = self._body_size + len(body)
        if size > self.server.max_body_bytes:
            self._too_large = True
            self._drop_body()
            return
        self._hold(len(body))
        self._body_size = size
        parts = self._body
        if parts and len(body) < _SMALL_PIECE:
            # Tiny chunks gather in one buffer: a bytes object and a list slot per 2-byte chunk cost ~65x
            # the bytes held (8 MB of body took 565 MB), which max_buffered_bytes did not see.
            last = parts[-1]
            if isinstance(last, bytearray):
                last += body
            else:
                parts.append(bytearray(body))
        else:
            parts.append(body)

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._continue_due = False  # the body is all here: no go-ahead needed
        if self._upgrade_head:
            return  # not a request yet: see _reparse_without_upgrade
        parser = self.parser
        request = HttpRequest(self, parser.get_method().decode("ascii", "replace"), self._url, self._headers)
        body = self._body
        # A lone piece is the first one, never a gathering buffer.
        request.body = cast(bytes, body[0]) if len(body) == 1 else b"".join(body)
        request.too_large = self._too_large
        request.keep_alive = parser.should_keep_alive()
        request.http10 = parser.get_http_version() == "1.0"
        self._body = []
        self._body_size = 0
        if request.too_large:
            request.keep_alive = False  # the rest of the body is not worth reading
        if self._task is None:
            self._task = self.loop.create_task(self._run(request))
        else:
            limit = self.server.limits.max_pipelined
            if len(self._pending) >= limit:  # what is read ahead is parsed whole: one read can hold thousands
                message = f"too many pipelined requests (the limit is {limit})"
                raise _Reject(503, message, _RETRY_LATER, limit="pipelined")
            self._pending.append(request)  # pipelined: answered in order
            self._pause_reading()

    # --- upgrade offers ------------------------------------------------------------------------------
    def _note_upgrade_offer(self) -> None:
        """Keep the head without its Upgrade header: llhttp stops at an upgrade, this server ignores it."""
        method = self.parser.get_method()
        if method == b"CONNECT":
            raise _Reject(405, "CONNECT is not supported")
        version = self.parser.get_http_version().encode()
        lines = [b"%s %s HTTP/%s\r\n" % (method, self._url, version)]
        lines.extend(b"%s: %s\r\n" % (k, v) for k, v in self._headers if k.lower() != b"upgrade")
        lines.append(b"\r\n")
        self._upgrade_head = b"".join(lines)

    def _reparse_without_upgrade(self, rest: bytes) -> None:
        # RFC 9110 §7.8: a server may ignore Upgrade and answer in HTTP/1.1. llhttp cannot go on after one
        # (and has skipped the body), so a fresh parser reads the head again without it, then the rest.
        head = self._upgrade_head
        self.parser = httptools.HttpRequestParser(self)
        self.data_received(head + rest)

    # --- buffered bytes ------------------------------------------------------------------------------
    def _hold(self, size: int) -> None:
        server = self.server
        if server.buffered + size > server.limits.max_buffered_bytes:
            message = "the server holds too many request bytes; retry shortly"
            raise _Reject(503, message, _RETRY_LATER, limit="buffered_bytes")
        server.buffered += size
        self._held += size

    def _release(self, size: int) -> None:
        size = min(size, self._held)
        self._held -= size
        self.server.buffered -= size

    def _drop_body(self) -> None:
        self._release(self._body_size)
        self._body = []
        self._body_size = 0

    # --- timeouts (called by the server's sweep) -----------------------------------------------------
    def check_timeouts(self, now: float, limits: ServerLimits) -> None:
        if self._task is not None or self._discarding:
            # A response is under way: a request read meanwhile waits for its turn, not the client. But a
            # client that stopped reading it (the write buffer over its high-water mark, no byte taken
            # since) would hold the connection and its handler forever.
            if self.write_paused and now - self._write_paused_at > limits.send_timeout_s:
                self.server.limit_hit("send_timeout")
                self._abort()
            return
        phase = self._phase
        if phase == _HEAD:
            if now - max(self._head_started, self.last_active) > limits.head_timeout_s:
                message = f"the request head did not arrive within {limits.head_timeout_s:g} s"
                self._fail(_Reject(408, message, limit="head_timeout"))
        elif phase == _BODY:
            if now - max(self._last_data, self.last_active) > limits.body_timeout_s:
                message = f"the request body stalled: no bytes for {limits.body_timeout_s:g} s"
                self._fail(_Reject(408, message, limit="body_timeout"))
        elif now - max(self._last_data, self.last_active) > limits.keepalive_timeout_s:
            self._close()

    # --- requests ------------------------------------------------------------------------------------
    async def _run(self, request: HttpRequest) -> None:
        while True:
            try:
                await self._respond(request)
                if self.write_paused:  # a client that pipelines and does not read is not answered ahead
                    await self.drain()
            except asyncio.CancelledError:
                self._abort()
                raise
            except ConnectionResetError:  # the client went away while the answer was being written
                self._abort()
                self._task = None
                return
            finally:
                self._release(len(request.body))
            self.last_active = self.loop.time()
            if self.closed or not request.keep_alive:
                self._task = None
                self._close()
                return
            if self._pending:
                request = self._pending.popleft()
                if not self._pending and self._deferred is None:
                    self._resume_reading()
                continue
            self._task = None
            if self._deferred is not None:
                self._answer_error(self._deferred)
            elif self._continue_due:
                self._continue_due = False
                self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            return

    async def _respond(self, request: HttpRequest) -> None:
        server = self.server
        try:
            response = await server.dispatch(request)
        except ConnectionResetError:
            raise
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            if request._stream is not None:
                self._abort()
                return
            response = json_error(500, "internal error in the server")
        stream = request._stream
        if stream is not None:
            if not stream.finished:
                # The handler stopped before the end of its stream: the client must not take it as whole.
                request.keep_alive = False
                self._abort()
            return
        if response is None:
            response = json_error(500, "the handler produced no response")
        try:
            head = self._response_head(request, response)
        except ValueError:
            log.exception("bad response headers from %s %s", request.method, request.path)
            response = json_error(500, "internal error in the server: bad response headers")
            head = self._response_head(request, response)
        self.send(head if request.method == "HEAD" else head + response.body)

    def _response_head(self, request: HttpRequest, response: Response) -> bytes:
        parts = [_status_line(response.status), _date.get()]
        if response.content_type is not None:
            parts.append(b"Content-Type: %s\r\n" % response.content_type)
        if response.headers:
            parts.append(format_headers(response.headers.items()))
        if response.raw_headers:
            check_header_lines(response.raw_headers)
            parts.append(response.raw_headers)
        if self.server.extra_headers:
            parts.append(self.server.extra_headers)
        if not request.keep_alive:
            parts.append(b"Connection: close\r\n")
        parts.append(b"Content-Length: %d\r\n\r\n" % len(response.body))
        return b"".join(parts)

    def send(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.transport.write(data)

    async def drain(self) -> None:
        if not self.write_paused:
            return
        if self.closed:
            raise ConnectionResetError("the client closed the connection")
        waiter = self._drain_waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._drain_waiter = None

    # --- errors and closing --------------------------------------------------------------------------
    def _fail(self, reason: _Reject) -> None:
        """The request being read cannot be served: answer ``reason`` in its turn, then close."""
        if reason.limit:
            self.server.limit_hit(reason.limit)
        self._drop_body()
        self._discarding = True  # the parser is in an error state, or the request is dropped
        if self._task is None:
            self._answer_error(reason)
        else:  # responses to earlier requests are under way: they go out first
            self._deferred = reason
            self._pause_reading()

    def _answer_error(self, reason: _Reject) -> None:
        """Write an error answer and close, lingering so that the client can read it first."""
        self._discarding = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        body = error_body(reason.status, reason.message)
        transport.write(
            b"%s%s%sContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (_status_line(reason.status), _date.get(), reason.headers, len(body), body)
        )
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # the client sees the end of the answer; what it still sends is dropped
        self._resume_reading()
        self.loop.call_later(LINGER_S, self._abort)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class HttpServer:
    """Routes by exact path then method; unknown paths get 404, other methods 405.

    A body over ``max_body_bytes`` is not kept: the handler gets ``request.too_large`` and answers 413 (after
    its own checks, such as authentication). Requests handled at once are capped by
    ``limits.max_concurrent_requests``, or ``concurrency_limit()`` when set (503 beyond it), except on the
    paths added with ``bounded=False`` (probes and metrics, which must answer under load).
    """

    def __init__(self, *, max_body_bytes: int, limits: ServerLimits | None = None) -> None:
        self.max_body_bytes = max_body_bytes
        self.limits = limits or ServerLimits()
        self.extra_headers = b""  # preformatted ``Name: value\r\n`` lines added to every handler's response
        self.routes: dict[str, dict[str, Handler]] = {}
        self.connections: set[_HttpProtocol] = set()
        self.buffered = 0  # request-body bytes held across all connections
        self.active = 0  # requests of bounded routes being handled
        self.on_limit: Callable[[str], None] | None = None  # told the name of each limit hit
        self.concurrency_limit: Callable[[], int] | None = None  # a bound that changes (over the limits')
        self._unbounded: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._address: tuple[str, int] | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the server runs on (set by ``start``)."""
        if self._loop is None:
            raise RuntimeError("the HTTP server has not been started")
        return self._loop

    def add_route(self, method: str, path: str, handler: Handler, *, bounded: bool = True) -> None:
        methods = self.routes.setdefault(path, {})
        methods[method] = handler
        if method == "GET":
            methods.setdefault("HEAD", handler)
        if not bounded:
            self._unbounded.add(path)

    def known_routes(self) -> str:
        """Every route as ``METHOD /path``, in the order they were added (HEAD, implied by GET, left out)."""
        return ", ".join(
            f"{method} {path}"
            for path, methods in self.routes.items()
            for method in methods
            if method != "HEAD"
        )

    def limit_hit(self, name: str) -> None:
        if self.on_limit is not None:
            self.on_limit(name)

    async def dispatch(self, request: HttpRequest) -> Response | None:
        methods = self.routes.get(request.path)
        if methods is None:
            return json_error(
                404, f"no route for {request.method} {request.path} (known: {self.known_routes()})"
            )
        handler = methods.get(request.method)
        if handler is None:
            return json_error(
                405,
                f"method {request.method} is not allowed on {request.path}",
                headers={"Allow": ",".join(sorted(methods))},
            )
        if request.path in self._unbounded:
            return await handler(request)
        bound = self.concurrency_limit
        limit = self.limits.max_concurrent_requests if bound is None else bound()
        if self.active >= limit:
            self.limit_hit("concurrent_requests")
            return json_error(
                503, f"too many requests at once (the limit is {limit})", headers={"Retry-After": "1"}
            )
        self.active += 1
        try:
            return await handler(request)
        finally:
            self.active -= 1

    async def start(self, host: str, port: int) -> tuple[str, int]:
        check_header_lines(self.extra_headers)
        self._loop = loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _HttpProtocol(self), host, port, reuse_address=True, backlog=1024
        )
        self._sweeper = loop.create_task(self._sweep())
        sockname = self._server.sockets[0].getsockname()
        self._address = (sockname[0], sockname[1])
        return sockname[0], sockname[1]

    def stop_listening(self, keep: HttpRequest | None = None) -> None:
        """Close the listening socket and drop every connection but ``keep``'s (fault injection: a server
        that is down refuses connections); ``listen_again`` undoes it."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for proto in list(self.connections):
            if keep is not None and proto is keep._proto:
                continue
            if proto._task is not None and not proto._task.done():
                proto._task.cancel()
            proto._abort()

    async def listen_again(self) -> None:
        """Listen on the address ``start`` bound, after ``stop_listening``."""
        if self._server is not None or self._address is None:
            return
        host, port = self._address
        self._server = await self.loop.create_server(
            lambda: _HttpProtocol(self), host, port, reuse_address=True, backlog=1024
        )

    async def _sweep(self) -> None:
        """Enforce the timeouts: a timer per connection would cost more than this scan does."""
        limits = self.limits
        shortest = min(
            limits.head_timeout_s, limits.body_timeout_s, limits.keepalive_timeout_s, limits.send_timeout_s
        )
        interval = min(1.0, max(0.01, shortest / 4))
        loop = self.loop
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for proto in list(self.connections):
                proto.check_timeouts(now, limits)

    async def drain(self, timeout_s: float) -> int:
        """Graceful shutdown's first half: refuse new connections, close the idle ones, and let the requests
        in progress finish (each connection closes after its answer) for up to ``timeout_s``. Returns how many
        were still running then; ``close`` cuts those."""
        self._address = None  # no listen_again after this
        if self._server is not None:
            self._server.close()  # the listening socket: new connections are refused from here on
        loop = self.loop
        deadline = loop.time() + timeout_s
        while True:
            busy = []
            for proto in list(self.connections):
                task = proto._task
                if task is not None and not task.done():
                    busy.append(task)
                else:
                    proto._close()  # idle (keep-alive, or a request still arriving): nothing to finish
            remaining = deadline - loop.time()
            if not busy or remaining <= 0:
                return len(busy)
            await asyncio.wait(busy, timeout=min(remaining, 0.1))

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        self._address = None  # no listen_again after this
        if self._server is not None:
            self._server.close()
        tasks = []
        for proto in list(self.connections):
            if proto._task is not None and not proto._task.done():
                proto._task.cancel()
                tasks.append(proto._task)
            proto._abort()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
