"""A lean HTTP/1.1 client for the gateway's upstream requests.

aiohttp's ClientSession costs more CPU per request than the rest of the proxy together; this client does
only what the gateway needs: one request at a time per connection (no pipelining), per-endpoint keep-alive
pools, Content-Length, chunked and read-until-close bodies (parsed by httptools/llhttp), body chunks handed
over as they arrive (SSE), a connect timeout, a first-byte timeout (request sent → first response byte),
an idle timeout (longest pause between response bytes) and a total timeout per request, and a bound on a
body read whole.

A connection goes back to its pool only after a complete response that allows keep-alive; anything else
(an error, a timeout, cancellation, a response abandoned before its end) closes it, so the model server
sees the client go away and aborts the request.
"""

from __future__ import annotations

import asyncio
import collections
from typing import cast

import httptools

# Body bytes buffered and not yet taken by next_chunk() at which the socket stops being read (streaming only).
_PAUSE_READING_AT = 1 << 20
_NO_BODY_STATUSES = frozenset({204, 304})
_FRAMING_HEADERS = frozenset({b"content-length", b"transfer-encoding"})


class UpstreamError(Exception):
    """The upstream request failed: refused, reset, closed early, malformed or too slow."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened (refused, unreachable or the connect timeout expired)."""


class UpstreamTimeoutError(UpstreamError):
    """The response did not arrive in time: ``phase`` says which timeout expired (``first-byte``: nothing
    came back after the request was sent; ``idle``: the response paused too long; ``total``: it was not
    complete within the total timeout)."""

    def __init__(self, message: str, phase: str = "total") -> None:
        super().__init__(message)
        self.phase = phase


class UpstreamBodyTooLargeError(UpstreamError):
    """A body read whole (``read(max_bytes=...)``) is larger than the bound."""


class UpstreamResponse:
    """Status, headers and body of one upstream response. Call ``release()`` when done with it."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_done",
        "_error",
        "_keep_alive",
        "_limit",
        "_waiter",
        "_whole",
        "headers",
        "status",
    )

    def __init__(self, conn: _Connection, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers  # raw (name, value) pairs, as received
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._done = False
        self._keep_alive = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._whole = False  # read() wants the whole body: buffering it all is the point, never pause
        self._limit = 0  # read()'s bound on the body (0: none)

    def header(self, name: bytes) -> str | None:
        """The first value of header ``name`` (lower-case bytes), decoded."""
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return None

    @property
    def complete(self) -> bool:
        return self._done

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The whole body; raises ``UpstreamError`` if the response fails before its end, and
        ``UpstreamBodyTooLargeError`` (closing the connection) once it holds more than ``max_bytes``."""
        if max_bytes is not None:
            self._limit = max_bytes
            length = self.header(b"content-length") or ""
            announced = int(length) if length.strip().isdigit() else 0
            if max(announced, self._buffered) > max_bytes:
                self._too_large()
        self._whole = True
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()
        while not self._done:
            if self._error is not None:
                raise self._error
            await self._wait()
        if self._error is not None:
            raise self._error
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        return body

    async def next_chunk(self) -> bytes:
        """The body bytes received since the last call, as soon as there are some; ``b""`` at the end."""
        chunks = self._chunks
        while not chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._wait()
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()
        return data

    async def _wait(self) -> None:
        conn = self._conn
        assert conn is not None
        waiter = self._waiter = conn.loop.create_future()
        try:
            await waiter
        except asyncio.CancelledError:
            self.release()  # cancelled mid-response: drop the connection so the upstream aborts too
            raise
        finally:
            self._waiter = None

    def release(self) -> None:
        """Give the connection back to its pool after a complete response, otherwise close it."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.finish_exchange(reusable=self._done and self._keep_alive and self._error is None)

    # --- fed by the connection -----------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _PAUSE_READING_AT and not self._whole and self._conn is not None:
            self._conn.pause()
        if self._limit and self._buffered > self._limit:
            self._too_large()
        self._wake()

    def _too_large(self) -> None:
        self._chunks.clear()
        self._buffered = 0
        self._error = UpstreamBodyTooLargeError(f"the response body is larger than {self._limit} bytes")
        self._wake()
        if self._conn is not None:
            self._conn.abort()

    def _finish(self, keep_alive: bool) -> None:
        self._done = True
        self._keep_alive = keep_alive
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._done:
            self._error = error
        self._wake()


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an endpoint; runs one request/response exchange at a time."""

    def __init__(self, pool: _EndpointPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        # The exchange in progress.
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._response: UpstreamResponse | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._received = False
        self._until_close = False
        self.deadline = 0.0  # loop time by which the exchange in progress must be complete
        # Loop time by which the next response byte must arrive (first-byte, then idle timeout; 0: none).
        self.byte_deadline = 0.0

    # --- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though uvloop's TCPTransport does not subclass asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        # asyncio and uvloop set TCP_NODELAY on TCP transports themselves.

    def data_received(self, data: bytes) -> None:
        self._received = True
        if self.byte_deadline:
            idle = self.pool.client.idle_timeout
            self.byte_deadline = self.loop.time() + idle if idle else 0.0
        if self._head is None and self._response is None:
            self.abort()  # bytes nobody asked for: the connection can no longer be trusted
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed response: {exc}"))
            self.abort()

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        response = self._response
        if response is not None and self._until_close and not response._done and response._error is None:
            response._finish(keep_alive=False)  # a body delimited by the end of the connection
        else:
            reason = f": {exc}" if exc else ""
            self._fail(UpstreamError(f"connection closed before the response was complete{reason}"))
        self._cancel_timer()

    def pause_writing(self) -> None:  # requests are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks -------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        headers = self._headers
        self._headers = []
        if 100 <= status < 200:
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        response = self._response = UpstreamResponse(self, status, headers)
        if status not in _NO_BODY_STATUSES:
            self._until_close = True
            for key, _ in headers:
                if key.lower() in _FRAMING_HEADERS:
                    self._until_close = False
                    break
        head = self._head
        self._head = None
        if head is not None and not head.done():
            head.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        response = self._response
        if response is not None and response.status >= 200:
            response._finish(keep_alive=self.parser.should_keep_alive() and not self._until_close)
            self._cancel_timer()

    # --- exchange ------------------------------------------------------------------------------------
    async def exchange(self, data: bytes, timeout: float) -> UpstreamResponse:
        self._received = False
        self._until_close = False
        head = self._head = self.loop.create_future()
        client = self.pool.client
        now = self.loop.time()
        self.deadline = now + timeout
        if client.first_byte_timeout:
            self.byte_deadline = now + client.first_byte_timeout
        elif client.idle_timeout:
            self.byte_deadline = now + client.idle_timeout
        client.active.add(self)
        assert self.transport is not None
        self.transport.write(data)
        try:
            return await head
        except BaseException:
            self.abort()
            raise

    def finish_exchange(self, reusable: bool) -> None:
        self._cancel_timer()
        self._response = None
        self._head = None
        if self.paused:
            self.resume()
        if reusable and not self.closed and self.transport is not None and not self.transport.is_closing():
            self.idle_since = self.loop.time()
            self.pool.put_idle(self)
        else:
            self.abort()

    def on_timeout(self, now: float) -> None:
        client = self.pool.client
        if self.deadline <= now:
            error = UpstreamTimeoutError(f"no complete response within {client.total_timeout:g} s", "total")
        elif not self._received:
            error = UpstreamTimeoutError(
                f"no response byte within {client.first_byte_timeout:g} s of the request", "first-byte"
            )
        else:
            error = UpstreamTimeoutError(
                f"the response stalled: no byte for {client.idle_timeout:g} s", "idle"
            )
        self._cancel_timer()
        self._fail(error)
        self.abort()

    def expired(self, now: float) -> bool:
        if self.deadline and self.deadline <= now:
            return True
        # Paused: the client is not reading, so the upstream's silence is not the upstream's fault.
        return 0.0 < self.byte_deadline <= now and not self.paused

    def _fail(self, error: BaseException) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not head.done():
                head.set_exception(error)
        if self._response is not None:
            self._response._fail(error)

    def _cancel_timer(self) -> None:
        self.byte_deadline = 0.0
        if self.deadline:
            self.deadline = 0.0
            self.pool.client.active.discard(self)

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            if self.byte_deadline and self.pool.client.idle_timeout:
                self.byte_deadline = self.loop.time() + self.pool.client.idle_timeout
            self.transport.resume_reading()

    def abort(self) -> None:
        self._cancel_timer()
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.abort()


class _EndpointPool:
    def __init__(self, client: UpstreamClient, host: str, port: int) -> None:
        self.client = client
        self.loop = client.loop
        self.host = host
        self.port = port
        self.idle: list[_Connection] = []

    def take_idle(self) -> _Connection | None:
        idle = self.idle
        expired_before = self.loop.time() - self.client.keepalive_timeout
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if conn.idle_since < expired_before:
                conn.abort()
                continue
            return conn
        return None

    def put_idle(self, conn: _Connection) -> None:
        self.idle.append(conn)  # in the order they went idle: the oldest first

    def expire_idle(self, before: float) -> None:
        """Close the idle connections idle since before ``before`` (``take_idle`` takes the newest, so
        without this the oldest would stay open until the server closed them)."""
        idle = self.idle
        count = 0
        while count < len(idle) and idle[count].idle_since < before:
            count += 1
        if count:
            expired = idle[:count]
            del idle[:count]
            for conn in expired:
                conn.abort()

    def forget(self, conn: _Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    async def connect(self) -> _Connection:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Connection(self), self.host, self.port),
                self.client.connect_timeout,
            )
        except TimeoutError as exc:
            raise UpstreamConnectError(
                f"connect to {self.host}:{self.port} timed out after {self.client.connect_timeout:g} s"
            ) from exc
        except OSError as exc:
            raise UpstreamConnectError(f"connect to {self.host}:{self.port} failed: {exc}") from exc
        return conn

    def close(self) -> None:
        for conn in list(self.idle):
            conn.abort()
        self.idle.clear()


class UpstreamClient:
    """Keep-alive connection pools, one per endpoint address (``host:port``)."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        total_timeout: float = 600.0,
        keepalive_timeout: float = 30.0,
        first_byte_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        """``first_byte_timeout``: from the request sent to the response's first byte; ``idle_timeout``:
        the longest pause between response bytes after that (None: only the total timeout)."""
        self.loop = asyncio.get_running_loop()
        self.connect_timeout = connect_timeout
        self.total_timeout = total_timeout
        self.keepalive_timeout = keepalive_timeout
        self.first_byte_timeout = first_byte_timeout or 0.0
        self.idle_timeout = idle_timeout or 0.0
        self._pools: dict[str, _EndpointPool] = {}
        # Timeouts: connections with an exchange in progress, checked by one periodic sweep rather than a
        # timer per request (the check interval is a tenth of the shortest timeout, at most a second).
        self.active: set[_Connection] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def _sweep(self) -> None:
        timeouts = [t for t in (self.total_timeout, self.first_byte_timeout, self.idle_timeout) if t]
        interval = max(0.001, min(1.0, min(timeouts) / 10))
        while True:
            await asyncio.sleep(interval)
            now = self.loop.time()
            expired = [conn for conn in self.active if conn.expired(now)]
            for conn in expired:
                conn.on_timeout(now)
            idle_before = now - self.keepalive_timeout
            for pool in self._pools.values():
                if pool.idle and pool.idle[0].idle_since < idle_before:
                    pool.expire_idle(idle_before)

    def _pool(self, address: str) -> _EndpointPool:
        pool = self._pools.get(address)
        if pool is None:
            host, _, port = address.rpartition(":")
            pool = self._pools[address] = _EndpointPool(self, host.strip("[]"), int(port))
        return pool

    async def request(
        self, address: str, method: str, path: str, headers: bytes = b"", body: bytes = b""
    ) -> UpstreamResponse:
        """Send a request and return once the response's status and headers are in.

        ``headers`` are preformatted ``Name: value\\r\\n`` lines (without Host and Content-Length, which are
        added here). Raises ``UpstreamError``; the caller must ``release()`` the response it gets.
        """
        pool = self._pool(address)
        if self._sweeper is None:
            self._sweeper = self.loop.create_task(self._sweep())
        data = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
            method.encode(),
            path.encode(),
            address.encode(),
            len(body),
            headers,
            body,
        )
        conn = pool.take_idle()
        if conn is not None:
            try:
                return await conn.exchange(data, self.total_timeout)
            except UpstreamTimeoutError:
                raise
            except UpstreamError:
                if conn._received:
                    raise
                # A kept-alive connection the server had closed meanwhile: once more on a fresh one.
        conn = await pool.connect()
        return await conn.exchange(data, self.total_timeout)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
