"""The HTTP server tests' app (routes that echo, stream, wait, hold, fail and write bad headers) on
``slorouter.http.server``, and a raw client connection to it with a bound on every read."""

from __future__ import annotations

import asyncio
import json

from slorouter.http.server import HttpRequest, HttpServer, Response, ServerLimits, json_response


class App:
    def __init__(self, limits: ServerLimits | None = None) -> None:
        self.server = HttpServer(max_body_bytes=1024, limits=limits)
        self.events: list[str] = []
        self.release = asyncio.Event()
        self.address = ""
        self.server.add_route("POST", "/echo", self.echo)
        self.server.add_route("GET", "/hello", self.hello)
        self.server.add_route("GET", "/stream", self.stream)
        self.server.add_route("GET", "/wait", self.wait)
        self.server.add_route("GET", "/boom", self.boom)
        self.server.add_route("POST", "/hold", self.hold)
        self.server.add_route("GET", "/bad-header", self.bad_header)
        self.server.add_route("GET", "/bad-raw-header", self.bad_raw_header)
        self.server.add_route("GET", "/bad-stream-header", self.bad_stream_header)

    async def start(self) -> App:
        host, port = await self.server.start("127.0.0.1", 0)
        self.address = f"{host}:{port}"
        return self

    async def echo(self, request: HttpRequest) -> Response:
        if request.too_large:
            return json_response(b'{"too": "large"}', status=413)
        test = (request.header(b"x-test") or b"").decode()
        return Response(
            200,
            request.body,
            headers={"X-Query": request.query.decode(), "X-Test": test},
            content_type=b"application/octet-stream",
        )

    async def hello(self, request: HttpRequest) -> Response:
        return json_response(b'{"hello": "world"}')

    async def stream(self, request: HttpRequest) -> None:
        writer = await request.start_stream(200, b"Content-Type: text/event-stream\r\n")
        await writer.write(b"data: one\n\n")
        await self.release.wait()
        await writer.write(b"data: two\n\n")
        await writer.write_eof()

    async def wait(self, request: HttpRequest) -> Response:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise
        return json_response(b"{}")

    async def boom(self, request: HttpRequest) -> Response:
        raise RuntimeError("boom")

    async def hold(self, request: HttpRequest) -> Response:
        """Keeps the request (and its body) until released."""
        self.events.append(f"hold {len(request.body)}")
        await self.release.wait()
        return json_response(b"{}")

    async def bad_header(self, request: HttpRequest) -> Response:
        return Response(200, b"{}", headers={"X-Echo": "a\r\nX-Injected: 1"})

    async def bad_raw_header(self, request: HttpRequest) -> Response:
        return Response(200, b"{}", raw_headers=b"X-Echo: a\nX-Injected: 1\r\n")

    async def bad_stream_header(self, request: HttpRequest) -> None:
        await request.start_stream(200, b"X-Echo: a\r\n\r\nX-Injected: 1\r\n")


WAIT = 10.0  # a bound on every read, never a speed expectation


class Client:
    """One raw connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, address: str) -> Client:
        host, port = address.rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(self) -> bytes:
        return await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), WAIT)

    async def response(self) -> tuple[bytes, bytes]:
        """One whole response with a Content-Length body: (head, body)."""
        head = await self.head()
        lines = head.lower().split(b"\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
        return head, await asyncio.wait_for(self.reader.readexactly(length), WAIT)

    async def chunked_body(self) -> bytes:
        body = b""
        while True:
            size = int(await asyncio.wait_for(self.reader.readuntil(b"\r\n"), WAIT), 16)
            chunk = await asyncio.wait_for(self.reader.readexactly(size + 2), WAIT)
            if size == 0:
                return body
            body += chunk[:-2]

    async def rest(self) -> bytes:
        """Everything up to the server's close."""
        return await asyncio.wait_for(self.reader.read(), WAIT)

    def close(self) -> None:
        self.writer.close()


def error_of(body: bytes) -> dict:
    """The ``error`` object of a JSON error body."""
    return json.loads(body)["error"]
