"""Bearer-token checks in constant time, shared by the gateway, the ext_proc picker and the predictor servers.

A presented token is hashed (SHA-256) and its digest compared with ``hmac.compare_digest`` against the digest
of every accepted token, without stopping at a match: the time taken depends neither on how much of a token
matched, nor on its length, nor on which of the accepted tokens it is.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aiohttp import web

from slorouter.http.errors import error_response
from slorouter.http.server import Handler, HttpRequest, Response, json_error

UNAUTHORIZED_MESSAGE = "a valid API key is required (Authorization: Bearer KEY)"
UNAUTHORIZED_TOKEN_MESSAGE = "a valid token is required (Authorization: Bearer TOKEN)"
WWW_AUTHENTICATE = {"WWW-Authenticate": "Bearer"}
# The predictor servers' token, when no --token-file is given.
TOKEN_ENV = "SLOROUTER_PREDICTOR_TOKEN"


def check_token_text(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token (it must be visible ASCII, no spaces), or None if it can.

    The message never quotes the token.
    """
    if not token:
        return "is empty"
    if not all(0x21 <= ord(c) <= 0x7E for c in token):
        return (
            "holds a character that is not visible ASCII (spaces, control characters and non-ASCII are not "
            "allowed in a bearer token)"
        )
    return None


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class BearerTokens:
    """The accepted tokens; ``accepts`` checks an ``Authorization`` header value. No tokens: all accepted."""

    __slots__ = ("_digests",)

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = tuple(_digest(token.encode("ascii")) for token in tokens)

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __repr__(self) -> str:
        return f"BearerTokens({len(self._digests)} tokens)"

    def accepts(self, authorization: bytes | str | None) -> bool:
        """Whether ``authorization`` is ``Bearer TOKEN`` (the scheme in any case) with an accepted token."""
        if not self._digests:
            return True
        if authorization is None:
            return False
        if isinstance(authorization, str):
            authorization = authorization.encode("utf-8", "surrogateescape")
        scheme, _, token = authorization.strip().partition(b" ")
        presented = _digest(token.strip())
        matched = False
        for expected in self._digests:
            matched |= hmac.compare_digest(presented, expected)
        return matched and scheme.lower() == b"bearer"


MAX_TOKEN_FILE_BYTES = 1 << 20


def parse_tokens(text: str, where: str) -> list[str]:
    """The tokens of a token file's text: one a line, blank lines and ``#`` comments ignored.

    ``ValueError`` names ``where`` and the line of a bad token (never the token), or says there is none.
    """
    tokens = []
    for number, line in enumerate(text.splitlines(), 1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        problem = check_token_text(token)
        if problem is not None:
            raise ValueError(f"{where}: line {number}: the token {problem}")
        tokens.append(token)
    if not tokens:
        raise ValueError(f"{where}: holds no token (one a line; blank lines and # comments are ignored)")
    return tokens


def read_token_file(path: str) -> list[str]:
    """The tokens in file ``path`` (``parse_tokens``); ``ValueError`` if it cannot be read or holds none."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_TOKEN_FILE_BYTES} bytes; is it a token file?")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: byte {exc.start} is not ASCII (tokens are visible ASCII)") from None
    return parse_tokens(text, path)


def read_token_env(name: str, environ: Mapping[str, str]) -> list[str]:
    """The comma-separated tokens in environment variable ``name``; ``ValueError`` if unset or empty."""
    value = environ.get(name)
    if value is None:
        raise ValueError(f"the environment variable {name} is not set")
    return parse_tokens(value.replace(",", "\n"), f"the environment variable {name}")


class InsecureBindError(ValueError):
    """A server that needs a token for non-loopback addresses was asked to listen on one without it."""


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name may resolve to any address: not known to be loopback


def check_bind(host: str, tokens: BearerTokens, what: str) -> None:
    """Refuse (``InsecureBindError``) to listen on a non-loopback ``host`` without a token."""
    if not tokens and not is_loopback(host):
        raise InsecureBindError(
            f"{what} refuses to listen on {host or 'every address'} without a token: anyone who can reach it "
            "could read predictions, post samples or fetch models; give --token-file FILE (or set "
            f"{TOKEN_ENV}), or listen on 127.0.0.1"
        )


def bearer_header(tokens: Sequence[str]) -> dict[str, str]:
    """The ``Authorization`` header a client sends with the first of ``tokens`` (none without one)."""
    return {"Authorization": f"Bearer {tokens[0]}"} if tokens else {}


def aiohttp_auth_middleware(tokens: BearerTokens, open_paths: frozenset[str]) -> Any:
    """An aiohttp middleware: every path but ``open_paths`` needs an accepted bearer token (401 otherwise)."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in open_paths or tokens.accepts(request.headers.get("Authorization")):
            response: web.StreamResponse = await handler(request)
            return response
        return error_response(401, UNAUTHORIZED_TOKEN_MESSAGE, headers=dict(WWW_AUTHENTICATE))

    return check


def lean_auth(tokens: BearerTokens, handler: Handler) -> Handler:
    """``handler`` of the lean HTTP server behind the bearer-token check (401 without an accepted token)."""
    if not tokens:
        return handler

    async def check(request: HttpRequest) -> Response | None:
        if tokens.accepts(request.header(b"authorization")):
            return await handler(request)
        return json_error(401, UNAUTHORIZED_TOKEN_MESSAGE, headers=dict(WWW_AUTHENTICATE))

    return check
