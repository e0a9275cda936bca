"""The bearer-token check: right answers, and no early exit that tells which token matched or how much."""

from __future__ import annotations

import hmac

import pytest

from slorouter.http import auth
from slorouter.http.auth import BearerTokens, check_token_text


def test_no_tokens_accepts_everything():
    tokens = BearerTokens([])
    assert not tokens
    assert tokens.accepts(None) and tokens.accepts(b"Bearer anything")


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (b"Bearer sk-one", True),
        (b"Bearer sk-two", True),
        ("Bearer sk-two", True),
        (b"bearer sk-one", True),  # the scheme is case-insensitive (RFC 9110 11.1)
        (b"BEARER  sk-one ", True),
        (b"Bearer sk-on", False),  # a prefix
        (b"Bearer sk-one1", False),
        (b"Bearer SK-ONE", False),  # the token is not
        (b"Basic sk-one", False),
        (b"sk-one", False),
        (b"Bearer", False),
        (b"", False),
        (None, False),
        ("Bearer sk-\u00e9", False),
        (b"Bearer \xff\xfe", False),
    ],
)
def test_accepts(header, accepted):
    assert BearerTokens(["sk-one", "sk-two"]).accepts(header) is accepted


def test_every_token_is_compared_whichever_matches(monkeypatch):
    calls: list[tuple[bytes, bytes]] = []
    compare = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    tokens = BearerTokens(["first", "second", "third"])
    for header in (b"Bearer first", b"Bearer third", b"Bearer none", b"Bearer " + b"x" * 5000):
        calls.clear()
        tokens.accepts(header)
        assert len(calls) == 3
        # Digests of one length whatever the presented token's: its length is not compared either.
        assert {len(a) for a, _ in calls} == {len(b) for _, b in calls} == {32}


def test_repr_names_no_token():
    assert "secret" not in repr(BearerTokens(["secret"]))


@pytest.mark.parametrize("token", ["", "has space", "tab\there", "caf\u00e9", "new\nline"])
def test_bad_token_text(token):
    problem = check_token_text(token)
    assert problem is not None
    assert token not in problem or not token


def test_good_token_text():
    assert check_token_text("sk-AZaz09._~+/=") is None
