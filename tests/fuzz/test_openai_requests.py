"""The OpenAI request parser (completions and chat) on generated bodies: valid ones (every prompt form,
content parts, tool messages, ``n``, ``stream_options``, any Unicode) parse, schedule and complete without
leaving in-flight load; invalid ones get a 400 naming the parameter; hostile bytes (deep nests, numbers of
thousands of digits, invalid UTF-8, truncation) get a 400; nothing else is raised. Then the regressions of
the defects the fuzzing found (docs/reliability.md, "Fuzzing")."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings

from slorouter.api.requests import parse_chat_completion, parse_completion
from slorouter.api.routing_headers import RoutingHints
from slorouter.clock import ManualClock
from slorouter.director import Director
from slorouter.http.errors import RequestError
from slorouter.metrics import GatewayMetrics
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext
from slorouter.serving.requests import inference_request
from tests.fuzz.strategies import OPENAI_CASES, OpenAICase, check_openai


@settings(max_examples=300, deadline=None)
@given(OPENAI_CASES)
def test_generated_bodies(case: OpenAICase) -> None:
    check_openai(case)


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


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True, [], 2**31])
def test_a_bad_n_is_a_400_naming_it(n):
    # It used to pass unchecked to the model server (only n in (None, 1) was told apart, and True == 1).
    for parse, body in [
        (parse_completion, {"model": "m", "prompt": "x", "n": n}),
        (parse_chat_completion, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": n}),
    ]:
        with pytest.raises(RequestError, match="'n' must be") as info:
            parse(json.dumps(body).encode())
        assert (info.value.param, info.value.status) == ("n", 400)


def test_n_of_one_or_null_keeps_the_history_form_and_more_drops_it():
    assert parse_completion(b'{"model": "m", "prompt": "x", "n": null}').history_form == "text"
    assert parse_completion(b'{"model": "m", "prompt": "x", "n": 1}').history_form == "text"
    assert parse_completion(b'{"model": "m", "prompt": "x", "n": 3}').history_form == ""


def test_a_batch_of_token_id_prompts_is_accepted():
    # A valid OpenAI prompt form (a list of token-id lists) that used to be refused with a 400.
    batch = parse_completion(b'{"model": "m", "prompt": [[1, 2, 3], [4, 5]]}')
    assert (batch.prompt_tokens, batch.history_form) == (5, "")
    one = parse_completion(b'{"model": "m", "prompt": [[1, 2, 3]]}')
    assert one.prompt_text == parse_completion(b'{"model": "m", "prompt": [1, 2, 3]}').prompt_text


@pytest.mark.parametrize("prompt", [[-1], [2**32], [[1], []], [[1], [-5]], [[1], "a"], [[True]], [1.0]])
def test_token_ids_out_of_range_or_of_another_type_are_a_400(prompt):
    with pytest.raises(RequestError, match="token ids") as info:
        parse_completion(json.dumps({"model": "m", "prompt": prompt}).encode())
    assert info.value.param == "prompt"


def test_content_parts_other_than_text_are_accepted_and_left_out_of_the_estimate():
    # Image, audio, file and refusal parts are valid OpenAI content; they used to be refused with a 400.
    parts = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    ]
    with_media = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    text_only = {"model": "m", "messages": [{"role": "user", "content": parts[:1]}]}
    parsed = parse_chat_completion(json.dumps(with_media).encode())
    assert parsed.prompt_tokens == parse_chat_completion(json.dumps(text_only).encode()).prompt_tokens
    assert "image_url" in parsed.prompt_text  # the prefix index still hashes the whole messages
    refusal = {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    assert parse_chat_completion(json.dumps({"model": "m", "messages": [refusal]}).encode())


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ([1], r"content\[0\] must be an object"),
        ([{"text": "x"}], r"content\[0\] must be an object with a string 'type'"),
        ([{"type": "text", "text": "x"}, {"type": "text"}], r"content\[1\] is a text part"),
        (3, "must be a string, an array of parts or null"),
    ],
)
def test_malformed_content_parts_are_a_400_naming_the_part(content, problem):
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    with pytest.raises(RequestError, match=problem) as info:
        parse_chat_completion(json.dumps(body).encode())
    assert info.value.param == "messages"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "prompt": "' + b"a" * 70 + b'\\ud800 lone surrogate"}',
        b'{"model": "m", "cache_salt": "\\ud800", "messages": [{"role": "user", "content": "\\ud83d"}]}',
        b'{"model": "m", "prompt": "\xed\xa0\x80"}',  # a surrogate as (invalid) UTF-8: json.loads takes it
    ],
    ids=["escaped-in-prompt", "in-salt-and-chat", "utf8-encoded"],
)
def test_a_lone_surrogate_is_hashed_by_the_prefix_plugin_not_failing_it(raw, caplog):
    # JSON allows "\ud800"; the prefix plugin's str.encode() raised UnicodeEncodeError on it, logged an
    # error with a traceback for every such request and routed it without prefix data.
    clock = ManualClock(100.0)
    pool = PoolState([Endpoint(a) for a in ("10.0.0.1:8000", "10.0.0.2:8000")])
    for endpoint in pool.endpoints:
        pool.set_metrics(endpoint.address, MetricsSnapshot(kv_usage=0.1), at=clock.now())
    setup = build_scheduler_setup(None, PluginContext(clock=clock, rng=np.random.default_rng(0), pool=pool))
    director = Director(pool, setup, InFlightTracker(pool), clock)
    parse = parse_chat_completion if b"messages" in raw else parse_completion
    request = inference_request(parse(raw), RoutingHints(), {}, "r1", clock.now())
    with caplog.at_level(logging.ERROR, logger="slorouter"):
        lifecycle = director.dispatch(request, director.schedule(request))
        lifecycle.on_headers(200, False)
        lifecycle.on_reply_text("a reply \udc00")
        lifecycle.end(usage={"completion_tokens": 3})
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert int(pool.columns["inflight_requests"].sum()) == 0


@pytest.mark.parametrize("model", ["m\\ud800", "\\udfff", "a\\ud83d"])
def test_a_model_name_with_a_lone_surrogate_is_a_400(model):
    # The model name labels the TTFT/TPOT histograms: one such request made every later GET /metrics a 500
    # (UnicodeEncodeError while the exposition was written as UTF-8).
    for raw in (
        b'{"model": "%s", "prompt": "x"}' % model.encode(),
        b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}]}' % model.encode(),
    ):
        parse = parse_chat_completion if b"messages" in raw else parse_completion
        with pytest.raises(RequestError, match="lone surrogate") as info:
            parse(raw)
        assert info.value.param == "model"


def test_a_unicode_model_name_labels_the_metrics():
    parsed = parse_completion('{"model": "модель-🦙", "prompt": "x"}'.encode())
    metrics = GatewayMetrics()
    metrics.latency_children(parsed.model, "")[0].observe(0.1)
    assert "модель-🦙" in metrics.render().decode()
