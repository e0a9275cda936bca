"""The lean HTTP/1.1 server against the attacks a front-line server must resist, over raw sockets on
127.0.0.1: request smuggling, bad chunked framing, oversized and slow request heads and bodies, pipelining
abuse, HTTP versions and the request target's forms (RFC 9112). What test_server_edges.py covers already
(CL/TE conflicts, duplicate Content-Length, single slow clients, the connection cap) is not repeated here.

Every wait is bounded (``WAIT``), never a speed expectation; timeouts are configured in tenths of a second
where a test needs one to fire, and long where it must not.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from slorouter.http.server import HttpRequest, HttpServer, Response, ServerLimits
from tests.gateway.conftest import eventually
from tests.helpers.http_app import WAIT, App, Client, error_of

LONG = ServerLimits(head_timeout_s=60, body_timeout_s=60, keepalive_timeout_s=60)


async def _app(limited: list[App], limits: ServerLimits = LONG) -> App:
    app = await App(limits).start()
    limited.append(app)
    return app


async def _until_closed(limited: list[App], data: bytes) -> bytes:
    """Send ``data`` on a fresh connection to a fresh app; all it answers up to its close."""
    app = await _app(limited)
    client = await Client.open(app.address)
    try:
        await client.send(data)
        return await client.rest()
    finally:
        client.close()


async def _two_bodies(limited: list[App], data: bytes) -> tuple[bytes, bytes]:
    """Send ``data`` (two requests) on a fresh connection to a fresh app; the bodies of the two answers."""
    app = await _app(limited)
    client = await Client.open(app.address)
    try:
        await client.send(data)
        return (await client.response())[1], (await client.response())[1]
    finally:
        client.close()


async def _send_until_closed(client: Client, prefix: bytes, filler: bytes, total: int) -> None:
    """Send ``prefix`` then ``filler`` until ``total`` bytes or the server stops reading."""
    sent = 0
    try:
        await client.send(prefix)
        while sent < total:
            await asyncio.wait_for(client.send(filler), WAIT)
            sent += len(filler)
    except (ConnectionError, TimeoutError):
        pass


# --- oversized heads -----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [b"X-Big: ", b"X-Big"], ids=["endless-value", "endless-name"])
async def test_one_endless_header_field_gets_431_before_the_head_timeout(limited, prefix):
    # httptools keeps a field to itself until it ends: the old code held 60+ MB of one value until the
    # head timeout fired (408), with a quadratic copy on every chunk.
    app = await _app(limited)
    client = await Client.open(app.address)
    sender = asyncio.create_task(
        _send_until_closed(client, b"GET /hello HTTP/1.1\r\nHost: x\r\n" + prefix, b"a" * 16384, 8 << 20)
    )
    try:
        head, body = await client.response()
        assert head.startswith(b"HTTP/1.1 431") and b"Connection: close" in head
        assert error_of(body)["type"] == "RequestHeaderFieldsTooLargeError"
    finally:
        sender.cancel()
        client.close()


# --- the request line and Host -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"GET /hello HTTP/1.1\r\n\r\n", id="http-1.1-without-host"),
        pytest.param(b"GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", id="two-hosts"),
        pytest.param(b"GET /hello HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", id="two-hosts-http-1.0"),
    ],
)
async def test_a_request_without_exactly_one_host_gets_400_and_the_connection_closes(limited, head):
    # RFC 9112 §3.2: a server MUST answer 400; they were served before.
    text = await _until_closed(limited, head + b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    assert text.startswith(b"HTTP/1.1 400") and b"Connection: close" in text
    assert b"Host" in text and text.count(b"\r\n\r\n") == 1  # one answer, nothing behind it


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        pytest.param(b"GET /hello HTTP/2.0\r\nHost: x\r\n", b"505", id="http-2.0"),
        pytest.param(b"GET /hello HTTP/0.9\r\nHost: x\r\n", b"505", id="http-0.9"),
        pytest.param(b"GET /hello\r\n", b"505", id="no-version"),
        pytest.param(b"GET /hello HTTP/3.0\r\nHost: x\r\n", b"400", id="http-3.0"),  # llhttp refuses
    ],
)
async def test_http_versions_other_than_1_x_get_505_or_400(limited, request_line, status):
    # They were answered as HTTP/1.x (llhttp parses them); RFC 9110 §15.6.6.
    text = await _until_closed(limited, request_line + b"\r\n")
    assert text.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in text
    assert b'"hello"' not in text


@pytest.mark.parametrize(
    ("target", "path", "query"),
    [
        (b"http://x/echo?a=1", b"/echo", b"a=1"),
        (b"http://x:8080/echo", b"/echo", b""),
        (b"HTTP://user@x/echo?b", b"/echo", b"b"),
        (b"http://x?c=2", b"/", b"c=2"),
    ],
)
async def test_an_absolute_form_target_is_served_by_its_path(limited, target, path, query):
    # RFC 9112 §3.2.2: a server MUST accept the absolute form; it got 404 ("no route for http://...").
    app = await _app(limited)
    client = await Client.open(app.address)
    try:
        await client.send(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi" % target)
        head, body = await client.response()
        if path == b"/echo":
            assert head.startswith(b"HTTP/1.1 200 OK") and body == b"hi"
            assert b"X-Query: %s\r\n" % query in head
        else:
            assert head.startswith(b"HTTP/1.1 404") and b"no route for POST / (known: " in body
    finally:
        client.close()


# --- framing that llhttp refuses (400 and close), beyond test_server_edges.py's list ----------------------

TE = b"Transfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"Content-Length: -1\r\n\r\n", id="cl-negative"),
        pytest.param(b"Content-Length: 0x3\r\n\r\nabc", id="cl-hex"),
        pytest.param(b"Content-Length: 1 2\r\n\r\nabc", id="cl-two-numbers"),
        pytest.param(b"Content-Length: 99999999999999999999999\r\n\r\n", id="cl-overflow"),
        pytest.param(b"Content-Length: \r\n\r\n", id="cl-empty"),
        pytest.param(
            b"Transfer-Encoding: chunked, identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="te-chunked-identity"
        ),
        pytest.param(b"Transfer-Encoding: chunked,\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="te-trailing-comma"),
        pytest.param(b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", id="te-chunked-twice"),
        pytest.param(b"Transfer-Encoding: identity\r\n\r\n", id="te-identity"),
        pytest.param(b"Transfer-Encoding: \r\n\r\n", id="te-empty"),
        pytest.param(b"Transfer-Encoding:\r\n chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="te-folded"),
        pytest.param(b"Transfer-Encoding: \x0bchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="te-vertical-tab"),
        pytest.param(b"Transfer-Encoding : chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="te-space-before-colon"),
        pytest.param(b" Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", id="te-leading-space"),
        pytest.param(TE + b"-1\r\nabc\r\n0\r\n\r\n", id="chunk-negative"),
        pytest.param(TE + b"fffffffffffffffff1\r\nabc\r\n0\r\n\r\n", id="chunk-size-overflow"),
        pytest.param(TE + b"0x3\r\nabc\r\n0\r\n\r\n", id="chunk-size-0x"),
        pytest.param(TE + b"3 \r\nabc\r\n0\r\n\r\n", id="chunk-size-space"),
        pytest.param(TE + b"3\nabc\n0\n\n", id="chunk-bare-lf"),
        pytest.param(TE + b"3;ext\nabc\r\n0\r\n\r\n", id="chunk-extension-bare-lf"),
        pytest.param(TE + b"3\r\nabc\rX0\r\n\r\n", id="chunk-data-bare-cr"),
        pytest.param(TE + b"3\r\nabc\r\n0\r\nGET", id="last-chunk-without-crlf"),
        pytest.param(b"X-A: a\x00b\r\n\r\n", id="nul-in-value"),
        pytest.param(b"X-A: a\rb\r\n\r\n", id="bare-cr-in-value"),
        pytest.param(b"X A: b\r\n\r\n", id="space-in-name"),
        pytest.param(b"X-A\r\n\r\n", id="field-without-colon"),
    ],
)
async def test_more_bad_framing_gets_400_and_the_connection_closes(limited, request_bytes):
    smuggled = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
    text = await _until_closed(limited, b"POST /echo HTTP/1.1\r\nHost: x\r\n" + request_bytes + smuggled)
    assert text.startswith(b"HTTP/1.1 400"), text
    assert b"Connection: close" in text and text.count(b"\r\n\r\n") == 1  # nothing smuggled answered
    assert b"\x00" not in text and b"\x0b" not in text  # the error names the fault, not the bytes


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param(b"3;name=value\r\nabc\r\n0\r\n\r\n", id="extension"),
        pytest.param(b'3;a="b;c";d\r\nabc\r\n0;e\r\n\r\n', id="quoted-extensions"),
        pytest.param(b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n", id="trailer"),
        pytest.param(b"000003\r\nabc\r\n0\r\n\r\n", id="leading-zeros"),
        pytest.param(b"1\r\na\r\n2\r\nbc\r\n0\r\n\r\n", id="several-chunks"),
    ],
)
async def test_valid_chunked_bodies_are_read_to_their_end(limited, chunks):
    # Chunk extensions and trailers are read and ignored (RFC 9112 §7.1.1, §7.1.2), and the next request
    # starts exactly where the last chunk ends.
    bodies = await _two_bodies(
        limited,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks
        + b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert bodies == (b"abc", b'{"hello": "world"}')


@pytest.mark.parametrize("length", [b"3 ", b"003", b"\t3"], ids=["trailing-space", "leading-zeros", "tab"])
async def test_content_length_with_whitespace_or_leading_zeros_frames_the_body(limited, length):
    bodies = await _two_bodies(
        limited,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\nabc" % length
        + b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert bodies == (b"abc", b'{"hello": "world"}')


async def test_a_body_of_tiny_chunks_is_held_in_a_few_buffers_and_arrives_whole():
    # One bytes object and a list slot per piece: 8 MB of body in 2-byte chunks took 565 MB of memory,
    # 65 times what max_buffered_bytes counted. Small pieces now gather in one buffer.
    server = HttpServer(max_body_bytes=1 << 20, limits=LONG)
    bodies: list[bytes] = []

    async def echo(request: HttpRequest) -> Response:
        bodies.append(request.body)
        return Response(200, request.body)

    server.add_route("POST", "/echo", echo)
    host, port = await server.start("127.0.0.1", 0)
    client = await Client.open(f"{host}:{port}")
    try:
        big = b"B" * 5000
        pieces = [big] + [b"%02d" % (i % 100) for i in range(20_000)] + [big, b"z"]
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        await client.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        await eventually(lambda: server.buffered == sum(map(len, pieces)))
        (proto,) = server.connections
        assert len(proto._body) <= 4  # big, the small ones, big, "z"
        await client.send(b"0\r\n\r\n")
        _, body = await client.response()
        assert body == bodies[0] == b"".join(pieces) and type(bodies[0]) is bytes
    finally:
        client.close()
        await server.close()


# --- transfer codings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "framing",
    [
        pytest.param(b"Transfer-Encoding: chunked\r\n", id="chunked"),
        pytest.param(b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", id="chunked-and-length"),
    ],
)
async def test_transfer_encoding_in_http_1_0_gets_400(limited, framing):
    # RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding MUST be taken as faulty framing; the old
    # code decoded it as chunked.
    chunks = b"\r\n3\r\nabc\r\n0\r\n\r\n"
    text = await _until_closed(limited, b"POST /echo HTTP/1.0\r\nHost: x\r\n" + framing + chunks)
    assert text.startswith(b"HTTP/1.1 400") and b"Connection: close" in text
    assert text.count(b"\r\n\r\n") == 1


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([b"gzip, chunked"], id="gzip-chunked"),
        pytest.param([b"identity, chunked"], id="identity-chunked"),
        pytest.param([b"gzip", b"chunked"], id="two-lines"),
        pytest.param([b"x, chunked"], id="unknown-coding"),
    ],
)
async def test_transfer_codings_other_than_chunked_get_501_and_the_connection_closes(limited, values):
    # llhttp frames these by their final chunked; the old code handed the handler the still-coded body.
    app = await _app(limited)
    client = await Client.open(app.address)
    lines = b"".join(b"Transfer-Encoding: %s\r\n" % v for v in values)
    try:
        await client.send(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n3\r\nabc\r\n0\r\n\r\n")
        text = await client.rest()
        assert text.startswith(b"HTTP/1.1 501") and b"Connection: close" in text
        assert text.count(b"\r\n\r\n") == 1
    finally:
        client.close()


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b"chunked", id="plain"),
        pytest.param(b"Chunked", id="case"),
        pytest.param(b"chunked ", id="trailing-space"),
        pytest.param(b"\tchunked", id="leading-tab"),
    ],
)
async def test_chunked_spelled_as_rfc_9110_allows_is_chunked(limited, value):
    # Field values lose their surrounding whitespace and codings are case-insensitive (RFC 9110 §5.5,
    # §7.8 of RFC 9112): these frame the body as chunked, and the next request is read where it ends.
    bodies = await _two_bodies(
        limited,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: %s\r\n\r\n3\r\nabc\r\n0\r\n\r\n" % value
        + b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert bodies == (b"abc", b'{"hello": "world"}')


# --- pipelining ----------------------------------------------------------------------------------------


async def _small_window_client(app: App) -> Client:
    """A connection with small socket buffers on both sides, so that what the client does not read stays
    with the server's transport instead of the kernel's buffers."""
    host, port = app.address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    client = Client(*await asyncio.open_connection(sock=sock))
    await eventually(lambda: len(app.server.connections) == 1)
    for proto in app.server.connections:
        assert proto.transport is not None
        proto.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return client


async def test_a_client_that_pipelines_without_reading_is_not_answered_ahead(limited):
    # The old code wrote each answer without waiting for the client: 100,000 pipelined GETs that were never
    # read left 8 MB in the server's write buffer, and more requests grew it without bound.
    app = await _app(limited, ServerLimits(keepalive_timeout_s=60, max_pipelined=100_000))
    client = await _small_window_client(app)
    count = 20_000
    writer = asyncio.create_task(client.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" * count))
    try:
        peak = 0
        for _ in range(50):  # a second of the server doing what it can
            await asyncio.sleep(0.02)
            for proto in app.server.connections:
                assert proto.transport is not None
                peak = max(peak, proto.transport.get_write_buffer_size())
        assert peak < 256 * 1024
        for _ in range(count):  # then every answer arrives, in order
            assert (await client.response())[1] == b'{"hello": "world"}'
        await asyncio.wait_for(writer, WAIT)
    finally:
        writer.cancel()
        client.close()


@pytest.mark.parametrize("path", [b"/hello", b"/stream"])
async def test_a_client_that_stops_reading_its_answers_is_dropped_after_the_send_timeout(limited, path):
    # A whole answer pipelined 20,000 times, or a stream, to a client that reads nothing: the server's write
    # buffer stays full. The old code waited for it forever, holding the connection and its handler.
    limits = ServerLimits(keepalive_timeout_s=60, send_timeout_s=0.5, max_pipelined=100_000)
    app = await _app(limited, limits)
    hits: list[str] = []
    app.server.on_limit = hits.append
    app.release.set()  # /stream sends its two events and ends
    client = await _small_window_client(app)
    writer = asyncio.create_task(client.send(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path * 20_000))
    try:
        await eventually(lambda: not app.server.connections)
        assert hits == ["send_timeout"]
    finally:
        writer.cancel()
        client.close()


async def test_requests_pipelined_beyond_the_limit_get_503_after_the_answers_before_them(limited):
    app = await _app(limited, ServerLimits(max_pipelined=3))
    hits: list[str] = []
    app.server.on_limit = hits.append
    client = await Client.open(app.address)
    try:
        # /wait holds the first answer, so the next ones are read ahead: three are kept, the fifth is refused.
        await client.send(
            b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" * 6
        )
        await eventually(lambda: hits == ["pipelined"])
        app.release.set()
        for _ in range(4):
            head, _ = await client.response()
            assert head.startswith(b"HTTP/1.1 200 OK")
        text = await client.rest()
        assert text.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in text and b"Connection: close" in text
        assert "pipelined" in error_of(text.partition(b"\r\n\r\n")[2])["message"]
    finally:
        client.close()


# --- concurrent requests -------------------------------------------------------------------------------


async def test_requests_beyond_the_concurrency_limit_get_503_and_unbounded_routes_still_answer(limited):
    app = await _app(limited, ServerLimits(max_concurrent_requests=2))
    hits: list[str] = []
    app.server.on_limit = hits.append
    app.server.add_route("GET", "/probe", app.hello, bounded=False)
    held = [await Client.open(app.address) for _ in range(2)]
    extra = await Client.open(app.address)
    try:
        for client in held:
            await client.send(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: app.server.active == 2)
        await extra.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = await extra.response()
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        assert b"Connection: close" not in head  # the request was read whole: the connection goes on
        assert "too many requests at once" in error_of(body)["message"] and hits == ["concurrent_requests"]
        await extra.send(b"GET /probe HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = await extra.response()
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b'{"hello": "world"}'
        app.release.set()
        for client in held:
            head, _ = await client.response()
            assert head.startswith(b"HTTP/1.1 200 OK")
        assert app.server.active == 0
        await extra.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _ = await extra.response()
        assert head.startswith(b"HTTP/1.1 200 OK")
    finally:
        for client in [*held, extra]:
            client.close()


async def test_each_limit_hit_is_reported_by_name(limited):
    app = await _app(
        limited,
        ServerLimits(
            head_timeout_s=0.3,
            body_timeout_s=0.3,
            keepalive_timeout_s=60,
            max_connections=3,
            max_buffered_bytes=500,
            max_head_bytes=1024,
            max_header_fields=10,
            max_target_bytes=256,
        ),
    )
    hits: list[str] = []
    app.server.on_limit = hits.append
    requests = {
        "target_bytes": b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "head_bytes": b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 2000 + b"\r\n\r\n",
        "head_timeout": b"GET /hello HTTP/1.1\r\nHost: x\r\n",
        "body_timeout": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab",
        "buffered_bytes": b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n" + b"c" * 900,
    }
    for name, data in requests.items():
        client = await Client.open(app.address)
        try:
            await client.send(data)
            assert (await client.rest()).startswith((b"HTTP/1.1 4", b"HTTP/1.1 503"))
            assert hits[-1] == name
        finally:
            client.close()
    await eventually(lambda: not app.server.connections)
    clients = [await Client.open(app.address) for _ in range(4)]
    try:
        await eventually(lambda: hits[-1] == "connections")
    finally:
        for client in clients:
            client.close()


# --- slowloris -----------------------------------------------------------------------------------------


async def _dribble(client: Client, data: bytes, stop: asyncio.Event) -> None:
    """Send ``data`` a little at a time until ``stop`` is set or the server closes."""
    while not stop.is_set():
        try:
            await client.send(data)
        except ConnectionError:
            return
        await asyncio.sleep(0.25)


async def test_hundreds_of_slow_clients_do_not_stop_normal_traffic_and_timeouts_close_them(limited):
    # 150 heads that never end (a header field every 0.25 s) and 150 bodies sent a byte every 0.25 s: the
    # bodies keep their connections while they keep sending (the body timeout bounds a pause, not the
    # upload), the heads until the head timeout. Meanwhile fresh clients are answered; then each slow
    # client gets its 408 and its connection is closed.
    limits = ServerLimits(head_timeout_s=3, body_timeout_s=1, keepalive_timeout_s=60)
    app = await _app(limited, limits)
    hits: list[str] = []
    app.server.on_limit = hits.append
    stop = asyncio.Event()
    heads = [await Client.open(app.address) for _ in range(150)]
    bodies = [await Client.open(app.address) for _ in range(150)]
    for client in heads:
        await client.send(b"GET /hello HTTP/1.1\r\nHost: x\r\n")
    for client in bodies:
        await client.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
    tasks = [asyncio.create_task(_dribble(c, b"X-Slow: 1\r\n", stop)) for c in heads]
    tasks += [asyncio.create_task(_dribble(c, b"x", stop)) for c in bodies]
    try:
        await eventually(lambda: len(app.server.connections) == 300)
        for i in range(20):  # normal traffic, on fresh connections and on one kept alive
            fresh = await Client.open(app.address)
            try:
                await fresh.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n%02d" % i)
                head, body = await fresh.response()
                assert head.startswith(b"HTTP/1.1 200 OK") and body == b"%02d" % i
            finally:
                fresh.close()
            assert len(app.server.connections) >= 150  # the slow bodies were all open meanwhile
        stop.set()  # the bodies now stall: the body timeout closes them, the head timeout the heads
        for client in heads + bodies:
            text = await client.rest()
            assert text.startswith(b"HTTP/1.1 408") and b"Connection: close" in text
        await eventually(lambda: not app.server.connections)
        assert hits.count("head_timeout") == 150 and hits.count("body_timeout") == 150
        assert app.server.buffered == 0
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        for client in heads + bodies:
            client.close()


async def test_a_connection_that_never_sends_a_byte_is_closed_by_the_keepalive_timeout(limited):
    # The head's clock starts at its first byte; before it, the connection is idle like one between
    # requests, and is closed without an answer.
    app = await _app(limited, ServerLimits(head_timeout_s=60, body_timeout_s=60, keepalive_timeout_s=0.3))
    client = await Client.open(app.address)
    try:
        assert await client.rest() == b""
        await eventually(lambda: not app.server.connections)
    finally:
        client.close()


# --- HTTP/1.0, Connection: close, Expect ---------------------------------------------------------------


async def test_http_1_0_gets_no_100_continue_and_its_body_is_read(limited):
    # 100 Continue is an HTTP/1.1 answer (RFC 9110 §10.1.1): an HTTP/1.0 client sends its body anyway.
    app = await _app(limited)
    client = await Client.open(app.address)
    try:
        await client.send(b"POST /echo HTTP/1.0\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        await asyncio.sleep(0.1)  # a 100 Continue, if wrongly sent, is there now
        await client.send(b"body")
        text = await client.rest()
        assert text.startswith(b"HTTP/1.1 200 OK") and text.endswith(b"body")
        assert b"100 Continue" not in text and b"Connection: close" in text
    finally:
        client.close()


async def test_expect_100_continue_then_a_client_that_sends_nothing_gets_408(limited):
    app = await _app(limited, ServerLimits(head_timeout_s=5, body_timeout_s=0.3, keepalive_timeout_s=5))
    client = await Client.open(app.address)
    try:
        await client.send(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        assert await client.head() == b"HTTP/1.1 100 Continue\r\n\r\n"
        text = await client.rest()
        assert text.startswith(b"HTTP/1.1 408") and b"Connection: close" in text
    finally:
        client.close()


@pytest.mark.parametrize(
    "connection", [b"close", b"Close", b"keep-alive, close", b"close, keep-alive"], ids=str
)
async def test_connection_close_in_any_spelling_closes_after_the_answer(limited, connection):
    text = await _until_closed(
        limited,
        b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: %s\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
        % connection,
    )
    assert text.count(b"HTTP/1.1 200 OK") == 1 and b"Connection: close" in text
