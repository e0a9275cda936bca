"""A lean HTTP/1.1 server for the gateway: asyncio.Protocol + httptools (llhttp).

aiohttp's web server costs more CPU per request than the proxying itself; the gateway needs little of it:
a fixed route table, whole request bodies up to a limit, plain responses and chunked streaming responses
with back-pressure, keep-alive, and the handler cancelled when its client goes away.

Handlers are ``async def handler(request: HttpRequest) -> Response | None``; a handler that streamed its
answer through ``request.start_stream`` returns None (or the ``Response`` it got is ignored).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from email.utils import formatdate
from http import HTTPStatus

import httptools

from slorouter.http.errors import error_body

log = logging.getLogger(__name__)

Handler = Callable[["HttpRequest"], Awaitable["Response | None"]]

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES: dict[int, bytes] = {}
_JSON = b"application/json"


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
    return b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers)


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
        if self.http10:
            self.keep_alive = False  # no chunked encoding in HTTP/1.0: the end of the body is the close
        writer = self._stream = StreamWriter(self._proto, self.keep_alive, chunked=not self.http10)
        writer.start(status, raw_headers)
        return writer


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


# Bounds on what one request head may hold, so a client cannot grow the gateway's memory with headers.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 200


class _HeadTooLarge(Exception):
    pass


class _HttpProtocol(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.write_paused = False
        self.last_active = 0.0
        self._drain_waiter: asyncio.Future[None] | None = None
        self._url = b""
        self._head_size = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._body_size = 0
        self._too_large = False
        self._pending: collections.deque[HttpRequest] = collections.deque()
        self._task: asyncio.Task[None] | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.last_active = self.loop.time()
        self.server.connections.add(self)
        # asyncio and uvloop set TCP_NODELAY on TCP transports themselves.

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._reject(
                    431, f"the request line and headers exceed {MAX_HEAD_BYTES} bytes or {MAX_HEADERS} fields"
                )
            else:
                self._reject(400, f"malformed HTTP request: {exc}")
        except httptools.HttpParserError as exc:
            self._reject(400, f"malformed HTTP request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._pending.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client went away: so does its request
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- httptools callbacks -------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._head_size = 0
        self._headers = []
        self._body = []
        self._body_size = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > MAX_HEAD_BYTES:
            raise _HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD_BYTES or len(self._headers) > MAX_HEADERS:
            raise _HeadTooLarge

    def on_headers_complete(self) -> None:
        expect_continue = False
        for name, value in self._headers:
            lower = name.lower()
            if lower == b"content-length":
                if value.strip().isdigit():
                    self._too_large = int(value) > self.server.max_body_bytes
            elif lower == b"expect":
                expect_continue = value.lower() == b"100-continue"
        if expect_continue and not self._too_large and self.transport is not None:
            # curl sends this for bodies over 1 KiB, and otherwise waits a second for the go-ahead.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._body_size += len(body)
        if self._body_size > self.server.max_body_bytes:
            self._too_large = True
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self.parser
        request = HttpRequest(self, parser.get_method().decode("ascii", "replace"), self._url, self._headers)
        body = self._body
        request.body = body[0] if len(body) == 1 else b"".join(body)
        request.too_large = self._too_large
        request.keep_alive = parser.should_keep_alive()
        request.http10 = parser.get_http_version() == "1.0"
        self._body = []
        if request.too_large:
            request.keep_alive = False  # the rest of the body is not worth reading
        if self._task is None:
            self._task = self.loop.create_task(self._run(request))
        else:
            self._pending.append(request)  # pipelined: answered in order
            self.transport.pause_reading()  # type: ignore[union-attr]

    # --- requests ------------------------------------------------------------------------------------
    async def _run(self, request: HttpRequest) -> None:
        while True:
            try:
                await self._respond(request)
            except asyncio.CancelledError:
                self._abort()
                raise
            except ConnectionResetError:  # the client went away while the answer was being written
                self._abort()
                self._task = None
                return
            self.last_active = self.loop.time()
            if self.closed or not request.keep_alive:
                self._task = None
                self._close()
                return
            if not self._pending:
                self._task = None
                return
            request = self._pending.popleft()
            if not self._pending:
                self.transport.resume_reading()  # type: ignore[union-attr]

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
            response = json_error(500, "internal error in the gateway")
        stream = request._stream
        if stream is not None:
            if not stream.finished:
                # The handler stopped before the end of its stream: the client must not take it as whole.
                request.keep_alive = False
                self._abort()
            return
        if response is None:
            response = json_error(500, "the handler produced no response")
        self.send_response(request, response)

    def send_response(self, request: HttpRequest, response: Response) -> None:
        parts = [_status_line(response.status), _date.get()]
        if response.content_type is not None:
            parts.append(b"Content-Type: %s\r\n" % response.content_type)
        if response.headers:
            parts.append(format_headers(response.headers.items()))
        if response.raw_headers:
            parts.append(response.raw_headers)
        if self.server.extra_headers:
            parts.append(self.server.extra_headers)
        if not request.keep_alive:
            parts.append(b"Connection: close\r\n")
        body = response.body
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        if request.method != "HEAD":
            parts.append(body)
        self.send(b"".join(parts))

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

    def _reject(self, status: int, message: str) -> None:
        if self.transport is not None and not self.transport.is_closing() and self._task is None:
            body = error_body(status, message)
            self.transport.write(
                b"%s%sContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                % (_status_line(status), _date.get(), len(body), body)
            )
        self._close()

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
    its own checks, such as authentication).
    """

    def __init__(self, *, max_body_bytes: int, keepalive_timeout: float = 75.0) -> None:
        self.max_body_bytes = max_body_bytes
        self.keepalive_timeout = keepalive_timeout
        self.extra_headers = b""  # preformatted ``Name: value\r\n`` lines added to every handler's response
        self.routes: dict[str, dict[str, Handler]] = {}
        self.connections: set[_HttpProtocol] = set()
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        methods = self.routes.setdefault(path, {})
        methods[method] = handler
        if method == "GET":
            methods.setdefault("HEAD", handler)

    async def dispatch(self, request: HttpRequest) -> Response | None:
        methods = self.routes.get(request.path)
        if methods is None:
            return json_error(404, f"no route for {request.path}")
        handler = methods.get(request.method)
        if handler is None:
            return json_error(
                405,
                f"method {request.method} is not allowed on {request.path}",
                headers={"Allow": ",".join(sorted(methods))},
            )
        return await handler(request)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _HttpProtocol(self), host, port, reuse_address=True, backlog=1024
        )
        self._sweeper = self.loop.create_task(self._sweep_idle())
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def _sweep_idle(self) -> None:
        interval = max(0.5, min(self.keepalive_timeout / 4, 15.0))
        while True:
            await asyncio.sleep(interval)
            expired = self.loop.time() - self.keepalive_timeout
            for proto in list(self.connections):
                if proto._task is None and proto.last_active < expired:
                    proto._close()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
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
