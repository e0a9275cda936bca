"""Bearer-token checks in constant time, shared by the gateway, the ext_proc picker and the predictor servers.

A presented token is hashed (SHA-256) and its digest compared with ``hmac.compare_digest`` against the digest
of every accepted token, without stopping at a match: the time taken depends neither on how much of a token
matched, nor on its length, nor on which of the accepted tokens it is.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

UNAUTHORIZED_MESSAGE = "a valid API key is required (Authorization: Bearer KEY)"
WWW_AUTHENTICATE = {"WWW-Authenticate": "Bearer"}


def check_token_text(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token (it must be visible ASCII, no spaces), or None if it can.

    The message never quotes the token.
    """
    if not token:
        return "is empty"
    if not all(0x21 <= ord(c) <= 0x7E for c in token):
        return "holds a character that is not visible ASCII (spaces, control characters and non-ASCII are "
        "not allowed in a bearer token)"
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
