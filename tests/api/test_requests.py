"""Request parsing: what the scheduler learns from a body."""

from __future__ import annotations

import json

import pytest

from slorouter.api.requests import (
    CHAT_ASSUMED_MAX_TOKENS,
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    check_content_type,
    parse_chat_completion,
    parse_completion,
)
from slorouter.http.errors import RequestError
from slorouter.tokenizer import count_tokens


def _raw(body: object) -> bytes:
    return json.dumps(body).encode()


def test_completion_fields():
    parsed = parse_completion(_raw({"model": "m", "prompt": "hello world", "max_tokens": 7, "stream": True}))
    assert parsed.model == "m"
    assert parsed.prompt_text == "hello world"
    assert parsed.prompt_tokens == count_tokens("hello world")
    assert parsed.max_tokens == 7
    assert parsed.stream is True


def test_completion_defaults_and_prompt_forms():
    assert parse_completion(_raw({"model": "m", "prompt": "x"})).max_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS
    assert parse_completion(_raw({"model": "m", "prompt": [1, 2, 3]})).prompt_tokens == 3
    parts = parse_completion(_raw({"model": "m", "prompt": ["ab", "cd"]}))
    assert parts.prompt_text == "abcd"


def test_chat_fields():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    parsed = parse_chat_completion(_raw({"model": "m", "messages": messages, "max_completion_tokens": 9}))
    assert parsed.max_tokens == 9
    assert json.loads(parsed.prompt_text) == messages
    assert parsed.prompt_tokens > 0
    default = parse_chat_completion(_raw({"model": "m", "messages": messages}))
    assert default.max_tokens == CHAT_ASSUMED_MAX_TOKENS


def test_chat_prefix_text_grows_with_the_conversation():
    first = [{"role": "user", "content": "a long question " * 20}]
    second = [*first, {"role": "assistant", "content": "answer"}, {"role": "user", "content": "more"}]
    a = parse_chat_completion(_raw({"model": "m", "messages": first})).prompt_text
    b = parse_chat_completion(_raw({"model": "m", "messages": second})).prompt_text
    assert b[: len(a) - 1] == a[:-1]  # same prefix up to the closing bracket


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "prompt": "x", "stream_options": 3}, "stream_options"),
        ({"model": "m", "prompt": "x", "cache_salt": 3}, "cache_salt"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": ""}, "prompt"),
        ({"model": "m", "prompt": [""]}, "prompt"),  # a batch with an empty prompt: no token to count
        ({"model": "m", "prompt": ["x", ""]}, "prompt"),
        ({"model": 3, "prompt": "x"}, "model"),
    ],
)
def test_completion_errors_name_the_param(body, param):
    with pytest.raises(RequestError) as info:
        parse_completion(_raw(body))
    assert info.value.param == param
    assert info.value.status == 400


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json", "Application/JSON; charset=utf-8", "application/vnd.api+json"],
)
def test_json_and_undeclared_bodies_are_taken(content_type: str | None) -> None:
    check_content_type(content_type)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x", "json"]
)
def test_other_content_types_are_415(content_type: str) -> None:
    with pytest.raises(RequestError, match="is not supported: send the body as JSON") as caught:
        check_content_type(content_type)
    assert caught.value.status == 415 and caught.value.param == "content-type"
