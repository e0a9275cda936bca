"""OpenAI-style JSON error responses."""

from __future__ import annotations

import json

from aiohttp import web

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    414: "URITooLongError",
    415: "UnsupportedMediaTypeError",
    429: "RateLimitError",
    431: "RequestHeaderFieldsTooLargeError",
    500: "InternalServerError",
    501: "NotImplementedError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
    505: "HTTPVersionNotSupportedError",
}


class RequestError(Exception):
    """A client error detected while parsing a request; becomes an OpenAI-style JSON error."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": ERROR_TYPES.get(status, "Error"),
                "param": param,
                "code": code if code is not None else status,
            }
        }
    ).encode()


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=error_body(status, message, param=param, code=code),
        content_type="application/json",
        headers=headers,
    )


# The end of an SSE stream of the OpenAI API.
SSE_DONE = b"data: [DONE]\n\n"


def sse_error_event(status: int, message: str, code: str | None = None) -> bytes:
    """An error delivered inside an already-started SSE stream, as vLLM does."""
    return b"data: " + error_body(status, message, code=code) + b"\n\n"
