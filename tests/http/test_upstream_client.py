"""The lean HTTP/1.1 upstream client, against real aiohttp servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from slorouter.http.upstream import (
    UpstreamBodyTooLargeError,
    UpstreamClient,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeoutError,
)
from tests.gateway.conftest import eventually

BIG = bytes(range(256)) * (3 * 4096)


class Server:
    def __init__(self) -> None:
        self.app = web.Application()
        self.peers: list[object] = []
        self.events: list[str] = []
        self.release = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.address = ""
        self.app.router.add_route("*", "/echo", self.echo)
        self.app.router.add_get("/chunked", self.chunked)
        self.app.router.add_get("/stream", self.stream)
        self.app.router.add_get("/close", self.close_after)
        self.app.router.add_get("/abort", self.abort)
        self.app.router.add_get("/slow", self.slow)
        self.app.router.add_get("/big", self.big)

    async def start(self) -> Server:
        self.runner = web.AppRunner(self.app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        host, port = self.runner.addresses[0][:2]
        self.address = f"{host}:{port}"
        return self

    def _peer(self, request: web.Request) -> None:
        self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)

    async def echo(self, request: web.Request) -> web.Response:
        self._peer(request)
        body = await request.read()
        return web.Response(
            body=body,
            headers={"X-Method": request.method, "X-Test": request.headers.get("X-Test", "")},
            content_type="application/octet-stream",
        )

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        self._peer(request)
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for i in range(5):
            await response.write(f"part{i};".encode())
        await response.write_eof()
        return response

    async def stream(self, request: web.Request) -> web.StreamResponse:
        self._peer(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: first\n\n")
        try:
            await self.release.wait()
            await response.write(b"data: second\n\n")
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise
        await response.write_eof()
        return response

    async def close_after(self, request: web.Request) -> web.Response:
        self._peer(request)
        return web.Response(body=b"bye", headers={"Connection": "close"})

    async def abort(self, request: web.Request) -> web.StreamResponse:
        self._peer(request)
        response = web.StreamResponse(headers={"Content-Length": "100"})
        await response.prepare(request)
        await response.write(b"only part")
        assert request.transport is not None
        request.transport.abort()
        return response

    async def slow(self, request: web.Request) -> web.Response:
        self._peer(request)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise
        return web.Response(body=b"late")

    async def big(self, request: web.Request) -> web.StreamResponse:
        """3 MiB, more than the client buffers before it stops reading; chunked if ``?chunked``."""
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        if "chunked" in request.query:
            response.enable_chunked_encoding()
        else:
            response.content_length = len(BIG)
        await response.prepare(request)
        for start in range(0, len(BIG), 1 << 16):
            await response.write(BIG[start : start + (1 << 16)])
        await response.write_eof()
        return response

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = await Server().start()
    try:
        yield s
    finally:
        s.release.set()
        await s.close()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient(connect_timeout=5, total_timeout=30)
    try:
        yield c
    finally:
        await c.close()


async def test_content_length_body_and_headers(server, client):
    body = b'{"hello": "world"}' * 100
    resp = await client.request(server.address, "POST", "/echo", b"X-Test: yes\r\n", body)
    try:
        assert resp.status == 200
        assert resp.header(b"x-method") == "POST"
        assert resp.header(b"x-test") == "yes"
        assert resp.header(b"content-type") == "application/octet-stream"
        assert await resp.read() == body
    finally:
        resp.release()


async def test_keep_alive_connection_is_reused_after_a_complete_response(server, client):
    for i in range(3):
        resp = await client.request(server.address, "POST", "/echo", body=str(i).encode())
        assert await resp.read() == str(i).encode()
        resp.release()
    assert len(server.peers) == 3
    assert len(set(server.peers)) == 1


async def test_chunked_body(server, client):
    resp = await client.request(server.address, "GET", "/chunked")
    try:
        assert resp.status == 200
        assert await resp.read() == b"part0;part1;part2;part3;part4;"
    finally:
        resp.release()
    resp = await client.request(server.address, "GET", "/chunked")  # reused after a chunked body
    assert await resp.read() == b"part0;part1;part2;part3;part4;"
    resp.release()
    assert len(set(server.peers)) == 1


async def test_streaming_chunks_arrive_before_the_end(server, client):
    resp = await client.request(server.address, "GET", "/stream")
    try:
        assert resp.header(b"content-type") == "text/event-stream"
        assert await resp.next_chunk() == b"data: first\n\n"
        assert not resp.complete
        server.release.set()
        rest = b""
        while chunk := await resp.next_chunk():
            rest += chunk
        assert rest == b"data: second\n\n"
        assert resp.complete
    finally:
        resp.release()


async def test_server_closing_the_connection_is_not_reused(server, client):
    resp = await client.request(server.address, "GET", "/close")
    assert await resp.read() == b"bye"
    resp.release()
    resp = await client.request(server.address, "POST", "/echo", body=b"x")
    assert await resp.read() == b"x"
    resp.release()
    assert len(set(server.peers)) == 2


async def test_idle_connection_closed_by_the_server_is_replaced(client):
    app = web.Application()
    app.router.add_post("/echo", _echo)
    short = web.AppRunner(app, keepalive_timeout=0.05)
    await short.setup()
    await web.TCPSite(short, "127.0.0.1", 0).start()
    host, port = short.addresses[0][:2]
    try:
        resp = await client.request(f"{host}:{port}", "POST", "/echo", body=b"1")
        assert await resp.read() == b"1"
        resp.release()
        pool = client._pools[f"{host}:{port}"]
        await eventually(lambda: not pool.idle)  # the server's keep-alive expired and it hung up
        resp = await client.request(f"{host}:{port}", "POST", "/echo", body=b"2")
        assert await resp.read() == b"2"
        resp.release()
    finally:
        await short.cleanup()


async def test_idle_connections_past_the_keepalive_timeout_are_closed_by_the_client(server):
    """The server keeps connections alive for 75 s; the client's own keep-alive (0.3 s) closes them all,
    the oldest too (a request takes the newest idle one, so nothing else would ever reach the oldest)."""
    client = UpstreamClient(connect_timeout=5, total_timeout=1, keepalive_timeout=0.3)
    try:
        server.release.clear()
        streams = [await client.request(server.address, "GET", "/stream") for _ in range(4)]
        for resp in streams:
            assert await resp.next_chunk() == b"data: first\n\n"
        server.release.set()
        for resp in streams:
            while await resp.next_chunk():
                pass
            resp.release()
        pool = client._pools[server.address]
        transports = [conn.transport for conn in pool.idle]
        assert len(transports) == 4  # four connections, all kept alive
        resp = await client.request(server.address, "POST", "/echo", body=b"x")  # takes the newest
        assert await resp.read() == b"x"
        resp.release()
        await eventually(lambda: not pool.idle, timeout=10)
        assert all(t is not None and t.is_closing() for t in transports)
    finally:
        await client.close()


async def _echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


async def test_connection_reset_mid_body_raises(server, client):
    resp = await client.request(server.address, "GET", "/abort")
    try:
        with pytest.raises(UpstreamError):
            await resp.read()
    finally:
        resp.release()
    assert not client._pools[server.address].idle


async def test_connect_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = UpstreamClient(connect_timeout=5, total_timeout=5)
    try:
        with pytest.raises(UpstreamConnectError):
            await client.request(f"127.0.0.1:{port}", "GET", "/")
    finally:
        await client.close()


async def test_connect_timeout():
    # A listening socket whose backlog is full never completes new handshakes.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    client = UpstreamClient(connect_timeout=0.2, total_timeout=5)
    try:
        for _ in range(8):
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
            fillers.append(f)
        with pytest.raises(UpstreamConnectError, match="timed out"):
            await client.request(f"127.0.0.1:{port}", "GET", "/")
    finally:
        await client.close()
        for f in fillers:
            f.close()
        listener.close()


async def test_total_timeout_closes_the_connection(server):
    client = UpstreamClient(connect_timeout=5, total_timeout=0.2)
    try:
        with pytest.raises(UpstreamTimeoutError):
            await client.request(server.address, "GET", "/slow")
        await eventually(lambda: "cancelled" in server.events)
    finally:
        await client.close()


async def test_total_timeout_while_streaming(server):
    client = UpstreamClient(connect_timeout=5, total_timeout=0.3)
    try:
        resp = await client.request(server.address, "GET", "/stream")
        assert await resp.next_chunk() == b"data: first\n\n"
        with pytest.raises(UpstreamTimeoutError):
            await resp.next_chunk()
        resp.release()
        await eventually(lambda: "cancelled" in server.events)
    finally:
        await client.close()


async def test_cancelling_while_waiting_for_headers_closes_the_connection(server, client):
    task = asyncio.create_task(client.request(server.address, "GET", "/slow"))
    await eventually(lambda: server.peers)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: "cancelled" in server.events)
    assert not client._pools[server.address].idle


async def test_cancelling_mid_stream_closes_the_connection(server, client):
    resp = await client.request(server.address, "GET", "/stream")
    assert await resp.next_chunk() == b"data: first\n\n"
    task = asyncio.create_task(resp.next_chunk())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: "cancelled" in server.events)
    assert not client._pools[server.address].idle


async def test_response_released_before_its_end_is_not_reused(server, client):
    resp = await client.request(server.address, "GET", "/stream")
    assert await resp.next_chunk() == b"data: first\n\n"
    resp.release()
    await eventually(lambda: "cancelled" in server.events)
    assert not client._pools[server.address].idle


async def test_interim_100_continue_is_skipped(server, client):
    resp = await client.request(server.address, "POST", "/echo", b"Expect: 100-continue\r\n", b"body")
    try:
        assert resp.status == 200
        assert await resp.read() == b"body"
    finally:
        resp.release()


async def test_body_delimited_by_the_close(client):
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello ")
        await writer.drain()
        writer.write(b"world")
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        resp = await client.request(f"127.0.0.1:{port}", "GET", "/")
        try:
            assert await resp.read() == b"hello world"
        finally:
            resp.release()
        assert not client._pools[f"127.0.0.1:{port}"].idle
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("path", ["/big", "/big?chunked"])
async def test_a_whole_body_larger_than_the_read_pause_mark_arrives(server, path):
    # Regression: the client stopped reading at 1 MiB buffered and only next_chunk() resumed it, so read()
    # waited for the total timeout. Here that timeout is the failure, far beyond what the transfer takes.
    client = UpstreamClient(connect_timeout=5, total_timeout=20)
    try:
        resp = await client.request(server.address, "GET", path)
        try:
            assert await resp.read() == BIG
        finally:
            resp.release()
    finally:
        await client.close()


async def test_a_streamed_body_larger_than_the_read_pause_mark_arrives_in_chunks(server, client):
    resp = await client.request(server.address, "GET", "/big")
    try:
        received = b""
        while chunk := await resp.next_chunk():
            received += chunk
        assert received == BIG
    finally:
        resp.release()


async def test_first_byte_timeout_expires_before_the_total_timeout(server):
    client = UpstreamClient(connect_timeout=5, total_timeout=30, first_byte_timeout=0.2)
    try:
        with pytest.raises(UpstreamTimeoutError, match=r"no response byte within 0\.2 s") as info:
            await client.request(server.address, "GET", "/slow")
        assert info.value.phase == "first-byte"
        await eventually(lambda: "cancelled" in server.events)
    finally:
        await client.close()


async def test_idle_timeout_expires_when_a_stream_stalls(server):
    client = UpstreamClient(connect_timeout=5, total_timeout=30, first_byte_timeout=5, idle_timeout=0.2)
    try:
        resp = await client.request(server.address, "GET", "/stream")
        assert await resp.next_chunk() == b"data: first\n\n"
        with pytest.raises(UpstreamTimeoutError, match="stalled") as info:
            await resp.next_chunk()
        assert info.value.phase == "idle"
        resp.release()
        await eventually(lambda: "cancelled" in server.events)
    finally:
        await client.close()


async def test_idle_timeout_does_not_expire_while_bytes_keep_coming(server):
    client = UpstreamClient(connect_timeout=5, total_timeout=30, first_byte_timeout=0.5, idle_timeout=0.5)
    try:
        for query in ("", "?chunked"):
            resp = await client.request(server.address, "GET", "/big" + query)
            assert await resp.read() == BIG
            resp.release()
    finally:
        await client.close()


async def test_a_body_over_the_bound_is_refused_and_its_connection_closed(server, client):
    for query in ("", "?chunked"):  # announced by Content-Length, or found while reading
        resp = await client.request(server.address, "GET", "/big" + query)
        try:
            with pytest.raises(UpstreamBodyTooLargeError, match="larger than 65536 bytes"):
                await resp.read(max_bytes=65536)
        finally:
            resp.release()
        assert not client._pools[server.address].idle
    resp = await client.request(server.address, "GET", "/big")
    assert await resp.read(max_bytes=len(BIG)) == BIG
    resp.release()
