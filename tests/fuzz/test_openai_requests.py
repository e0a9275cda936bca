"""The OpenAI request parser (completions and chat): regressions of the defects the fuzzing found
(docs/reliability.md, "Fuzzing")."""

from __future__ import annotations

import json

import pytest

from slorouter.api.requests import parse_chat_completion, parse_completion
from slorouter.http.errors import RequestError

DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE = b"1" * 5000


@pytest.mark.parametrize("parse", [parse_completion, parse_chat_completion])
@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b'{"model": "m", "prompt": "x", "extra": ' + DEEP + b"}", "nested too deeply"),
        (b'{"model": "m", "prompt": "x", "max_tokens": ' + HUGE + b"}", "digits"),
    ],
    ids=["deep-nest", "5000-digit-integer"],
)
def test_a_deep_nest_or_a_huge_integer_is_a_400_not_a_crash(parse, raw, problem):
    with pytest.raises(RequestError, match=problem) as info:
        parse(raw)
    assert info.value.status == 400


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [2**31, 2**63, 10**30])
def test_a_token_limit_beyond_int32_is_a_400_naming_it(key, value):
    # 2**63 used to pass the parser and raise OverflowError in the in-flight accounting (a 500, with the
    # request's in-flight count left behind); 2**62 passed and overflowed the pool's sums silently.
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], key: value}
    with pytest.raises(RequestError, match="at most 2147483647") as info:
        parse_chat_completion(json.dumps(body).encode())
    assert info.value.param == key
    if key == "max_tokens":
        with pytest.raises(RequestError, match="at most 2147483647"):
            parse_completion(json.dumps({"model": "m", "prompt": "x", key: value}).encode())
    assert parse_completion(json.dumps({"model": "m", "prompt": "x", "max_tokens": 2**31 - 1}).encode())
