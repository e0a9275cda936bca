"""The lean HTTP/1.1 server, driven by aiohttp's client and by raw sockets on 127.0.0.1.

Framing, pipelining, keep-alive and streaming; the edge cases (slow clients, limits, upgrades, smuggling,
pipelined errors) are in test_server_edges.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.gateway.conftest import eventually
from tests.helpers.http_app import App


@pytest.fixture
async def app() -> AsyncIterator[App]:
    a = await App().start()
    try:
        yield a
    finally:
        a.release.set()
        await a.server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def _raw(address: str, data: bytes, read_until_close: bool = True) -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read() if read_until_close else reader.read(65536), 10)
    finally:
        writer.close()


async def test_body_headers_and_query_reach_the_handler(app, http):
    async with http.post(f"http://{app.address}/echo?a=1", data=b"payload", headers={"X-Test": "t"}) as r:
        assert r.status == 200
        assert await r.read() == b"payload"
        assert r.headers["X-Query"] == "a=1"
        assert r.headers["X-Test"] == "t"
        assert r.headers["Content-Type"] == "application/octet-stream"
        assert "Date" in r.headers


async def test_keep_alive_serves_several_requests_on_one_connection(app, http):
    for i in range(5):
        async with http.post(f"http://{app.address}/echo", data=str(i).encode()) as r:
            assert await r.read() == str(i).encode()
    assert len(app.server.connections) == 1


async def test_chunked_request_body(app, http):
    async def parts() -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"part{i};".encode()

    async with http.post(f"http://{app.address}/echo", data=parts()) as r:
        assert await r.read() == b"part0;part1;part2;"


async def test_pipelined_requests_are_answered_in_order(app):
    request = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"
    data = request + b"a" + request + b"b" + b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    text = await _raw(app.address, data)
    assert text.count(b"HTTP/1.1 200 OK") == 3
    assert text.index(b"\r\n\r\na") < text.index(b"\r\n\r\nb") < text.index(b'{"hello"')


async def test_connection_close_and_http_1_0(app):
    text = await _raw(app.address, b"GET /hello HTTP/1.0\r\n\r\n")
    assert text.startswith(b"HTTP/1.1 200 OK")
    assert b"Connection: close" in text
    assert text.endswith(b'{"hello": "world"}')


async def test_unknown_path_and_method_get_json_errors(app, http):
    async with http.get(f"http://{app.address}/nothing") as r:
        assert r.status == 404
        assert (await r.json())["error"]["type"] == "NotFoundError"
    async with http.put(f"http://{app.address}/hello") as r:
        assert r.status == 405
        assert r.headers["Allow"] == "GET,HEAD"
        assert (await r.json())["error"]["type"] == "MethodNotAllowedError"


async def test_head_gets_headers_only(app, http):
    async with http.head(f"http://{app.address}/hello") as r:
        assert r.status == 200
        assert r.headers["Content-Length"] == str(len(b'{"hello": "world"}'))
        assert await r.read() == b""


async def test_body_over_the_limit_is_flagged_not_kept(app, http):
    async with http.post(f"http://{app.address}/echo", data=b"x" * 5000) as r:
        assert r.status == 413


async def test_malformed_request_gets_400_and_close(app):
    text = await _raw(app.address, b"NOT HTTP AT ALL\r\n\r\n")
    assert text.startswith(b"HTTP/1.1 400 Bad Request")
    assert b"malformed" in text


async def test_handler_error_gets_500(app, http):
    async with http.get(f"http://{app.address}/boom") as r:
        assert r.status == 500
        assert (await r.json())["error"]["type"] == "InternalServerError"


async def test_streaming_response_is_chunked_and_flushed_early(app, http):
    async with http.get(f"http://{app.address}/stream") as r:
        assert r.status == 200
        assert r.headers["Transfer-Encoding"] == "chunked"
        assert await r.content.readuntil(b"\n\n") == b"data: one\n\n"
        app.release.set()
        assert await r.read() == b"data: two\n\n"


async def test_client_disconnect_cancels_the_handler(app, http):
    task = asyncio.create_task(http.get(f"http://{app.address}/wait"))
    await eventually(lambda: any(p._task is not None for p in app.server.connections))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: "cancelled" in app.events)
    await eventually(lambda: not app.server.connections)


async def test_expect_100_continue_gets_the_go_ahead(app):
    host, port = app.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"body")
        text = await asyncio.wait_for(reader.read(), 10)
        assert text.startswith(b"HTTP/1.1 200 OK") and text.endswith(b"body")
    finally:
        writer.close()


async def test_http_1_0_stream_is_delimited_by_the_close(app):
    app.release.set()
    text = await _raw(app.address, b"GET /stream HTTP/1.0\r\n\r\n")
    head, _, body = text.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head
    assert b"Connection: close" in head
    assert body == b"data: one\n\ndata: two\n\n"


@pytest.mark.parametrize(
    "head",
    [
        b"GET /hello HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(300)) + b"\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 70_000 + b"\r\n\r\n",
    ],
)
async def test_oversized_request_heads_get_431_and_the_connection_closes(app, head):
    text = await _raw(app.address, head)
    assert text.startswith(b"HTTP/1.1 431")
    assert b"exceed" in text


@pytest.mark.parametrize("size", [9_000, 70_000, 1_000_000])
async def test_an_oversized_request_target_gets_414_and_the_connection_closes(app, size):
    # It got 431 (fields too large) before; RFC 9112 §3: a target longer than the server parses is 414.
    text = await _raw(app.address, b"GET /" + b"a" * size + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = text.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 414 Request-URI Too Long") and b"Connection: close" in head
    assert b"URITooLongError" in body and b"aaaa" not in text


async def test_a_request_target_at_the_limit_is_served(app):
    text = await _raw(app.address, b"GET /hello?" + b"a" * 8000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", False)
    assert text.startswith(b"HTTP/1.1 200 OK")
