"""Pieces shared by the training and prediction servers: JSON bodies, errors, probes, /metrics, lifecycle."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from slorouter.gateway.errors import RequestError, error_response
from slorouter.gateway.server import HttpRequest, HttpServer, Response, json_error

log = logging.getLogger("slorouter.predictor")

JSON_SEPARATORS = (",", ":")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a valid JSON number")


_DUMPS_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def dumps(data: Any) -> bytes:
    """Compact JSON (orjson: NaN and infinities become null, as JSON has no such numbers)."""
    return orjson.dumps(data, option=_DUMPS_OPTIONS)


def json_response(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(data), status=status, content_type="application/json", headers=headers)


def raw_json_response(body: bytes, *, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The whole request body; ``RequestError`` 413 over ``max_bytes``, 400 when empty.

    The application's ``client_max_size`` must be ``max_bytes`` (aiohttp enforces it while reading).
    """
    if request.content_length is not None and request.content_length > max_bytes:
        raise RequestError(f"request body too large: the limit is {max_bytes} bytes", status=413)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(f"request body too large: the limit is {max_bytes} bytes", status=413) from None
    if not body:
        raise RequestError("request body is empty; expected a JSON object")
    return body


def parse_json(body: bytes) -> Any:
    """``body`` as JSON; ``RequestError`` (400) if it is not JSON.

    orjson parses (several times faster than the standard library); what it refuses is parsed again by the
    standard library, which accepts integers beyond 64 bits (then refused by range checks that name the
    field) and words the error. NaN and Infinity are rejected by both: they are not JSON.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None


async def read_json(request: web.Request, max_bytes: int) -> Any:
    """The request body as JSON; ``RequestError`` (400, or 413 over ``max_bytes``) otherwise."""
    return parse_json(await read_body(request, max_bytes))


def request_error_response(exc: RequestError) -> web.Response:
    return error_response(exc.status, exc.message, param=exc.param)


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle


async def healthz(_: web.Request) -> web.Response:
    return json_response({"status": "ok"})


def readyz_handler(
    is_ready: Callable[[], bool], detail: Callable[[], dict[str, Any]] | None = None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        extra = detail() if detail else {}
        if is_ready():
            return json_response({"status": "ready", **extra})
        return json_response({"status": "not ready", **extra}, status=503)

    return handle


def parse_etags(header: str | None) -> set[str]:
    """The entity tags of an ``If-None-Match`` header, unquoted (weak ones compare like strong ones here)."""
    if not header:
        return set()
    tags = set()
    for part in header.split(","):
        tag = part.strip()
        if tag.startswith("W/"):
            tag = tag[2:]
        if len(tag) >= 2 and tag[0] == tag[-1] == '"':
            tag = tag[1:-1]
        if tag:
            tags.add(tag)
    return tags


@dataclass
class RunningServer:
    """A server listening on a socket; ``url`` is its base URL."""

    host: str
    port: int
    _close: Callable[[], Awaitable[None]]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        await self._close()


async def listen(app: web.Application, host: str, port: int) -> RunningServer:
    """Serve an aiohttp application."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return RunningServer(str(bound_host), int(bound_port), runner.cleanup)


async def listen_lean(server: HttpServer, host: str, port: int) -> RunningServer:
    """Serve routes of the gateway's lean HTTP/1.1 server (a fraction of aiohttp's CPU per request)."""
    bound_host, bound_port = await server.start(host, port)
    return RunningServer(str(bound_host), int(bound_port), server.close)


def lean_body(request: HttpRequest) -> bytes:
    """The whole body of a lean-server request; ``RequestError`` 413 over the server's limit, 400 if empty."""
    if request.too_large:
        raise RequestError(f"request body too large: the limit is {request.max_body_bytes} bytes", status=413)
    if not request.body:
        raise RequestError("request body is empty; expected a JSON object")
    return request.body


def lean_json(data: Any, *, status: int = 200) -> Response:
    return Response(status, dumps(data), content_type=b"application/json")


def lean_error(exc: RequestError) -> Response:
    return json_error(exc.status, exc.message, param=exc.param)


async def wait_for_signal() -> None:
    """Return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
