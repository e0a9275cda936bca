"""JSON bodies (aiohttp side) and If-None-Match entity tags."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from slorouter.http.errors import RequestError
from slorouter.http.headers import parse_etags
from slorouter.http.json_bodies import read_json
from slorouter.http.running import listen


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, set()),
        ("", set()),
        ('"v1"', {"v1"}),
        ('W/"v1"', {"v1"}),
        ('"v1", "v2"', {"v1", "v2"}),
        ("v3", {"v3"}),
        ('"v1",,W/"v2"', {"v1", "v2"}),
    ],
)
def test_parse_etags(header: str | None, expected: set[str]) -> None:
    assert parse_etags(header) == expected


async def test_read_json_errors(http: aiohttp.ClientSession) -> None:
    async def echo(request: web.Request) -> web.Response:
        try:
            data = await read_json(request, 64)
        except RequestError as exc:
            return web.json_response({"status": exc.status, "message": exc.message})
        return web.json_response({"status": 200, "data": data})

    app = web.Application(client_max_size=64)
    app.router.add_post("/", echo)
    server = await listen(app, "127.0.0.1", 0)
    try:
        cases = [
            (b'{"a": 1}', 200, None),
            (b"", 400, "empty"),
            (b"{nope", 400, "not valid JSON"),
            (b'{"a": NaN}', 400, "NaN is not a valid JSON number"),
            (b'{"a": Infinity}', 400, "Infinity"),
            (b"\xff\xfe", 400, "not valid JSON"),
            (b'{"a": "' + b"x" * 100 + b'"}', 413, "64 bytes"),
        ]
        for body, status, message in cases:
            async with http.post(server.url + "/", data=body) as response:
                result = await response.json()
            assert result["status"] == status, body
            if message:
                assert message in result["message"], result
    finally:
        await server.close()
