"""The OpenAI request parser (completions and chat): regressions of the defects the fuzzing found
(docs/reliability.md, "Fuzzing")."""

from __future__ import annotations

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
