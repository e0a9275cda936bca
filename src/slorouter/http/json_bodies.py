"""JSON request and response bodies, for the lean server and for aiohttp applications alike."""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

from slorouter.http.errors import RequestError, error_response
from slorouter.http.server import HttpRequest, Response, json_error

_DUMPS_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a valid JSON number")


def dumps(data: Any) -> bytes:
    """Compact JSON (orjson: NaN and infinities become null, as JSON has no such numbers)."""
    return orjson.dumps(data, option=_DUMPS_OPTIONS)


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
    except RecursionError:  # deeper than orjson's 1,024 levels and the standard library's stack
        raise RequestError("request body is not valid JSON: nested too deeply") from None


# --- the lean server (slorouter.http.server) ------------------------------------------------------------
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


# --- aiohttp applications --------------------------------------------------------------------------------
def json_response(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=dumps(data), status=status, content_type="application/json", headers=headers)


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


async def read_json(request: web.Request, max_bytes: int) -> Any:
    """The request body as JSON; ``RequestError`` (400, or 413 over ``max_bytes``) otherwise."""
    return parse_json(await read_body(request, max_bytes))


def request_error_response(exc: RequestError) -> web.Response:
    return error_response(exc.status, exc.message, param=exc.param)
