"""Edge cases of the lean HTTP/1.1 server, over raw sockets on 127.0.0.1.

Each defect found while hardening the server has its regression test here: 100 Continue inside a streamed
response, Upgrade offers, slow heads and bodies, the connection and buffered-bytes caps, CR/LF in response
headers, and a parse error in a pipelined request killing the response in flight. Timeouts are configured
small (tenths of a second) and every wait is bounded generously, so the tests do not depend on the machine's
speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from slorouter.http.server import ServerLimits
from tests.gateway.conftest import eventually
from tests.helpers.http_app import WAIT, App, Client, error_of


async def _started(limits: ServerLimits | None = None) -> App:
    return await App(limits).start()


@pytest.fixture
async def app() -> AsyncIterator[App]:
    a = await _started()
    try:
        yield a
    finally:
        a.release.set()
        await a.server.close()


# --- 100 Continue --------------------------------------------------------------------------------------


async def test_100_continue_for_a_pipelined_request_waits_for_the_streamed_response_before_it(app):
    client = await Client.open(app.address)
    try:
        await client.send(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await client.head()
        assert b"Transfer-Encoding: chunked" in head
        assert await asyncio.wait_for(client.reader.readuntil(b"data: one\n\n\r\n"), WAIT)
        await client.send(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        await asyncio.sleep(0.1)  # the server reads that head while the stream is open; old code: 100 here
        app.release.set()
        assert await client.chunked_body() == b"data: two\n\n"  # the stream is intact
        assert await client.head() == b"HTTP/1.1 100 Continue\r\n\r\n"  # then the go-ahead, in its turn
        await client.send(b"body")
        head, body = await client.response()
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"body"
    finally:
        client.close()


async def test_no_100_continue_when_the_body_is_over_the_limit(app):
    client = await Client.open(app.address)
    try:
        await client.send(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
        )
        await client.send(b"x" * 5000)
        head, _ = await client.response()
        assert head.startswith(b"HTTP/1.1 413")
    finally:
        client.close()


# --- Upgrade offers ------------------------------------------------------------------------------------

H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"


async def test_an_h2c_upgrade_offer_is_ignored_and_answered_in_http_1_1(app):
    client = await Client.open(app.address)
    try:
        await client.send(
            b"GET /hello HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        for _ in range(2):  # the offer's answer, then the next request on the same connection
            head, body = await client.response()
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert body == b'{"hello": "world"}'
    finally:
        client.close()


async def test_an_upgrade_offer_with_a_body_keeps_its_body(app):
    client = await Client.open(app.address)
    try:
        await client.send(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + H2C + b"Content-Length: 5\r\n\r\nhello")
        head, body = await client.response()
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"hello"
        await client.send(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + H2C + b"Transfer-Encoding: chunked\r\n\r\n")
        await client.send(b"3\r\nabc\r\n0\r\n\r\n")
        head, body = await client.response()
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"abc"
    finally:
        client.close()


async def test_connect_gets_405_and_the_connection_closes(app):
    client = await Client.open(app.address)
    try:
        await client.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        text = await client.rest()
        assert text.startswith(b"HTTP/1.1 405")
        assert b"Connection: close" in text
    finally:
        client.close()


# --- slow clients --------------------------------------------------------------------------------------


async def test_a_slow_request_head_gets_408_with_a_json_body_and_close(limited):
    app = await _started(ServerLimits(head_timeout_s=0.3, body_timeout_s=5, keepalive_timeout_s=5))
    limited.append(app)
    client = await Client.open(app.address)
    try:
        await client.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
        dribble = asyncio.create_task(_dribble_headers(client))  # activity all along, the head never ends
        text = await client.rest()
        dribble.cancel()
        head, _, body = text.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408")
        assert b"Connection: close" in head and b"Content-Type: application/json" in head
        assert error_of(body)["type"] == "RequestTimeoutError"
        assert "head" in error_of(body)["message"]
    finally:
        client.close()


async def _dribble_headers(client: Client) -> None:
    for i in range(200):
        try:
            await client.send(b"X-%d: v\r\n" % i)
        except ConnectionError:
            return
        await asyncio.sleep(0.05)


async def test_a_stalled_request_body_gets_408(limited):
    app = await _started(ServerLimits(head_timeout_s=5, body_timeout_s=0.3, keepalive_timeout_s=5))
    limited.append(app)
    client = await Client.open(app.address)
    try:
        await client.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
        text = await client.rest()
        head, _, body = text.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head
        assert "body" in error_of(body)["message"]
    finally:
        client.close()


async def test_a_slow_upload_that_keeps_sending_is_served(limited):
    # Every pause is below the body timeout, the whole upload takes several times the timeout.
    app = await _started(ServerLimits(head_timeout_s=5, body_timeout_s=0.5, keepalive_timeout_s=5))
    limited.append(app)
    client = await Client.open(app.address)
    try:
        await client.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
        for _ in range(20):
            await client.send(b"x")
            await asyncio.sleep(0.1)
        head, body = await client.response()
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"x" * 20
    finally:
        client.close()


async def test_idle_connections_are_closed_after_the_keepalive_timeout(limited):
    app = await _started(ServerLimits(head_timeout_s=5, body_timeout_s=5, keepalive_timeout_s=0.2))
    limited.append(app)
    client = await Client.open(app.address)
    try:
        await client.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        await client.response()
        assert await client.rest() == b""  # closed by the server, without an answer: no request was open
    finally:
        client.close()


async def test_no_timeout_while_the_response_is_under_way(limited):
    app = await _started(ServerLimits(head_timeout_s=0.2, body_timeout_s=0.2, keepalive_timeout_s=0.2))
    limited.append(app)
    client = await Client.open(app.address)
    try:
        await client.send(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\nGET /hel")  # and a pipelined head, half sent
        await asyncio.sleep(0.6)
        assert app.events == []  # the handler was not cancelled
        app.release.set()
        head, _ = await client.response()
        assert head.startswith(b"HTTP/1.1 200 OK")
        await client.send(b"lo HTTP/1.1\r\nHost: x\r\n\r\n")  # the head's clock started at its turn
        head, body = await client.response()
        assert body == b'{"hello": "world"}'
    finally:
        client.close()


# --- caps ----------------------------------------------------------------------------------------------


async def test_connections_beyond_the_cap_get_503(limited):
    app = await _started(ServerLimits(max_connections=2))
    limited.append(app)
    clients = [await Client.open(app.address) for _ in range(2)]
    try:
        for client in clients:
            await client.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            await client.response()
        extra = await Client.open(app.address)
        await extra.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        text = await extra.rest()
        extra.close()
        head, _, body = text.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head and b"Connection: close" in head
        assert "too many connections" in error_of(body)["message"]
        clients.pop().close()
        await eventually(lambda: len(app.server.connections) < 2)
        again = await Client.open(app.address)
        clients.append(again)
        await again.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _ = await again.response()
        assert head.startswith(b"HTTP/1.1 200 OK")
    finally:
        for client in clients:
            client.close()


async def test_request_bytes_beyond_the_buffered_cap_get_503_and_are_released_after(limited):
    app = await _started(ServerLimits(max_buffered_bytes=1000))
    limited.append(app)
    holder = await Client.open(app.address)
    other = await Client.open(app.address)
    try:
        await holder.send(b"POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n" + b"a" * 800)
        await eventually(lambda: app.events == ["hold 800"])
        assert app.server.buffered == 800
        await other.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n" + b"b" * 800)
        text = await other.rest()
        assert text.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in text
        app.release.set()
        head, _ = await holder.response()
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert app.server.buffered == 0
        await holder.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n" + b"c" * 800)
        head, body = await holder.response()
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"c" * 800
    finally:
        holder.close()
        other.close()


async def test_buffered_bytes_are_released_when_the_client_goes_away(app):
    client = await Client.open(app.address)
    await client.send(b"POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n" + b"a" * 500)
    await eventually(lambda: app.server.buffered == 500)
    client.close()
    await eventually(lambda: app.server.buffered == 0 and not app.server.connections)


# --- response headers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [b"/bad-header", b"/bad-raw-header", b"/bad-stream-header"])
async def test_response_headers_with_cr_or_lf_are_refused_with_500(app, path):
    client = await Client.open(app.address)
    try:
        await client.send(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
        head, body = await client.response()
        assert head.startswith(b"HTTP/1.1 500")
        assert b"X-Injected" not in head and b"X-Echo" not in head
        await client.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")  # the connection still serves
        head, body = await client.response()
        assert body == b'{"hello": "world"}'
    finally:
        client.close()


# --- pipelining and errors -----------------------------------------------------------------------------


async def test_a_parse_error_in_a_pipelined_request_waits_for_the_streamed_response_in_flight(app):
    client = await Client.open(app.address)
    try:
        await client.send(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        await client.head()
        assert await asyncio.wait_for(client.reader.readuntil(b"data: one\n\n\r\n"), WAIT)
        await client.send(b"NOT HTTP AT ALL\r\n\r\n")
        await asyncio.sleep(0.1)  # lets the server read the bad request while the stream is open
        app.release.set()
        assert await client.chunked_body() == b"data: two\n\n"
        text = await client.rest()
        assert text.startswith(b"HTTP/1.1 400") and b"Connection: close" in text
    finally:
        client.close()


async def test_a_parse_error_after_pipelined_requests_is_answered_after_them(app):
    good = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"
    client = await Client.open(app.address)
    try:
        await client.send(
            good + b"a" + good + b"b" + b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n"
        )
        assert (await client.response())[1] == b"a"
        assert (await client.response())[1] == b"b"
        assert (await client.rest()).startswith(b"HTTP/1.1 400")
    finally:
        client.close()


async def test_connection_close_on_http_1_1_closes_after_the_answer(app):
    client = await Client.open(app.address)
    try:
        await client.send(
            b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        text = await client.rest()
        assert text.count(b"HTTP/1.1 200 OK") == 1 and b"Connection: close" in text
    finally:
        client.close()


async def test_http_1_0_keep_alive_is_honoured(app):
    client = await Client.open(app.address)
    try:
        for _ in range(2):
            await client.send(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            head, _ = await client.response()
            assert head.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" not in head
    finally:
        client.close()


# --- framing and smuggling -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", id="duplicate-content-length"),
        pytest.param(b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", id="conflicting-content-length"),
        pytest.param(b"Content-Length: 3, 3\r\n\r\nabc", id="content-length-list"),
        pytest.param(b"Content-Length: +3\r\n\r\nabc", id="signed-content-length"),
        pytest.param(
            b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="cl-then-te"
        ),
        pytest.param(
            b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="te-then-cl"
        ),
        pytest.param(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", id="te-2"),
        pytest.param(b"Transfer-Encoding: gzip\r\n\r\nabc", id="te-not-chunked"),
        pytest.param(b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", id="chunked-not-last"),
        pytest.param(b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", id="te-lookalike"),
        pytest.param(b"Content-Length : 3\r\n\r\nabc", id="space-before-colon"),
        pytest.param(b"X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", id="obsolete-line-folding"),
        pytest.param(b"X-A: a\nContent-Length: 0\r\n\r\n", id="bare-lf"),
        pytest.param(b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", id="bad-chunk-size"),
        pytest.param(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n", id="long-chunk"),
        pytest.param(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc0\r\n\r\n", id="chunk-without-crlf"),
    ],
)
async def test_ambiguous_or_bad_framing_gets_400_and_the_connection_closes(app, request_bytes):
    client = await Client.open(app.address)
    try:
        await client.send(
            b"POST /echo HTTP/1.1\r\nHost: x\r\n" + request_bytes + b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        text = await client.rest()
        assert text.startswith(b"HTTP/1.1 400"), text
        assert b"Connection: close" in text
        assert text.count(b"HTTP/1.1 ") == 1  # nothing smuggled behind it was answered
    finally:
        client.close()
