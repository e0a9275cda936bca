"""The priority sent to the model servers: the value rule, the body rewrite, each endpoint's form, and the
configuration's checks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slorouter.api.requests import parse_chat_completion, parse_completion
from slorouter.api.routing_headers import RoutingHints
from slorouter.config import ConfigError, parse_config
from slorouter.pool.config import HIGHER_FIRST, LOWER_FIRST
from slorouter.pool.state import Endpoint
from slorouter.serving.engine_priority import EnginePriority, engine_value, with_priority

# --- the value --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("priority", [-3, -1, 0, 1, 10, 2**40])
def test_vllm_gets_the_negation_and_sglang_the_value(priority: int):
    assert engine_value(priority, LOWER_FIRST) == -priority
    assert engine_value(priority, HIGHER_FIRST) == priority


def test_a_more_important_objective_runs_first_in_both_senses():
    critical, standard, batch = 5, 0, -1
    vllm = [engine_value(p, LOWER_FIRST) for p in (critical, standard, batch)]
    sglang = [engine_value(p, HIGHER_FIRST) for p in (critical, standard, batch)]
    assert vllm == sorted(vllm)  # lower first
    assert sglang == sorted(sglang, reverse=True)  # higher first


# --- the body rewrite -------------------------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_objects = st.dictionaries(st.text(max_size=10), _json, max_size=6)
_white = st.text(alphabet=" \t\r\n", max_size=3)


def _encode(body: dict[str, Any], indent: int | None, ascii_only: bool) -> bytes:
    return json.dumps(body, indent=indent, ensure_ascii=ascii_only).encode("utf-8")


@given(
    _objects,
    st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1),
    _white,
    st.sampled_from([None, 0, 2]),
    st.booleans(),
)
def test_the_rewrite_adds_the_field_and_keeps_every_other_key(body, value, before, indent, ascii_only):
    raw = before.encode() + _encode(body, indent, ascii_only)
    client = "priority" in body
    out = with_priority(raw, value, client_priority=client)
    parsed = json.loads(out)
    assert parsed["priority"] == value
    assert {k: v for k, v in parsed.items() if k != "priority"} == {
        k: v for k, v in body.items() if k != "priority"
    }
    if not client:  # the fast path: the client's bytes follow the field unchanged
        assert out.endswith(raw[raw.index(b"{") + 1 :])


@given(_objects, st.integers(min_value=-100, max_value=100), st.integers(min_value=-100, max_value=100))
def test_a_client_priority_is_replaced_and_not_repeated(body, client_value, value):
    raw = json.dumps({**body, "priority": client_value}).encode()
    out = with_priority(raw, value, client_priority=True)
    assert json.loads(out) == {**body, "priority": value}
    pairs = json.loads(out, object_pairs_hook=lambda items: items)
    assert [key for key, _ in pairs].count("priority") == 1


def test_a_repeated_client_priority_leaves_one_key():
    out = with_priority(b'{"priority": 1, "model": "m", "priority": 2}', -5, client_priority=True)
    assert out == b'{"priority":-5,"model":"m"}'


def test_the_common_path_splices_bytes():
    raw = b'{"model": "m", "prompt": "caf\xc3\xa9", "max_tokens": 4}'
    assert with_priority(raw, -5) == b'{"priority":-5,"model": "m", "prompt": "caf\xc3\xa9", "max_tokens": 4}'
    assert with_priority(b" \r\n\t{ }", 3) == b' \r\n\t{"priority":3 }'


@pytest.mark.parametrize(
    "raw",
    [
        b'\xef\xbb\xbf{"model": "m"}',  # a UTF-8 byte-order mark
        '{"model": "m"}'.encode("utf-16-le"),
        '{"model": "m"}'.encode("utf-16"),
        '{"model": "m"}'.encode("utf-32-le"),
        '{"model": "m"}'.encode("utf-16-be"),
    ],
)
def test_bodies_json_reads_in_other_encodings_are_serialised_again(raw: bytes):
    out = with_priority(raw, 7)
    assert json.loads(out.decode("utf-8")) == {"priority": 7, "model": "m"}


def test_an_escaped_lone_surrogate_survives_the_slow_path():
    out = with_priority(b'{"priority": 1, "prompt": "\\ud800"}', 2, client_priority=True)
    assert json.loads(out) == {"priority": 2, "prompt": "\ud800"}


def test_the_parsers_say_whether_the_client_sent_a_priority():
    completion = {"model": "m", "prompt": "hi"}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi", "priority": 3}]}
    assert not parse_completion(json.dumps(completion).encode()).client_priority
    assert parse_completion(json.dumps({**completion, "priority": 0}).encode()).client_priority
    assert not parse_chat_completion(json.dumps(chat).encode()).client_priority  # nested: not the field
    assert parse_chat_completion(json.dumps({**chat, "priority": None}).encode()).client_priority


# --- each endpoint's form, each request's value ----------------------------------------------------------

BODY = b'{"model": "m", "prompt": "hi"}'


def _engine(pool: dict[str, Any], objectives: dict[str, Any] | None = None) -> EnginePriority:
    config = parse_config({"pool": pool, "objectives": objectives or {}})
    engine = EnginePriority.from_config(config)
    assert engine is not None
    return engine


def _sent(engine: EnginePriority, endpoint: Endpoint, priority: int) -> int | None:
    return json.loads(engine.body(BODY, priority, endpoint)).get("priority")


def test_off_unless_configured():
    assert EnginePriority.from_config(parse_config({"pool": {"endpoints": ["a:1"]}})) is None
    off = parse_config(
        {"pool": {"endpoints": ["a:1"], "model_server_type": "vllm", "engine_priority": False}}
    )
    assert EnginePriority.from_config(off) is None
    assert EnginePriority.from_config(parse_config({})) is None


def test_the_form_follows_the_model_server_type():
    vllm = _engine({"endpoints": ["a:1"], "model_server_type": "vllm", "engine_priority": True})
    sglang = _engine({"endpoints": ["a:1"], "model_server_type": "sglang", "engine_priority": True})
    assert _sent(vllm, Endpoint("a:1"), 5) == -5
    assert _sent(sglang, Endpoint("a:1"), 5) == 5


def test_a_mixed_pool_gives_each_endpoint_its_form():
    engine = _engine(
        {
            "model_server_type": "vllm",
            "engine_priority": True,
            "endpoints": [
                "v:1",
                {"address": "s:1", "model_server_type": "sglang"},
                {"address": "l:1", "labels": {"llm-d.ai/engine-type": "sglang"}},
                {"address": "t:1", "model_server_type": "trtllm"},  # takes none: its body is the client's
                {"address": "o:1", "engine_priority": False},
                {
                    "address": "low:1",
                    "model_server_type": "sglang",
                    "engine_priority": {"order": "lower-first"},
                },
            ],
        }
    )
    endpoints = {address: Endpoint(address) for address in ("v:1", "s:1", "t:1", "o:1", "low:1")}
    endpoints["l:1"] = Endpoint("l:1", labels={"llm-d.ai/engine-type": "sglang"})
    sent = {address: _sent(engine, endpoint, 3) for address, endpoint in endpoints.items()}
    assert sent == {"v:1": -3, "s:1": 3, "l:1": 3, "t:1": None, "o:1": None, "low:1": -3}
    assert engine.body(BODY, 3, endpoints["t:1"]) is BODY
    pick_first = [endpoints[a] for a in ("v:1", "s:1", "low:1", "t:1")]
    assert engine.same_form(pick_first) == [endpoints["v:1"], endpoints["low:1"]]
    assert engine.same_form([endpoints["t:1"], endpoints["o:1"], endpoints["v:1"]]) == [
        endpoints["t:1"],
        endpoints["o:1"],
    ]


def test_discovered_pods_take_the_form_of_their_engine_label():
    engine = _engine(
        {
            "kubernetes": {"namespace": "llm", "inference_pool": "p"},
            "model_server_type": "vllm",
            "engine_priority": True,
        }
    )
    assert _sent(engine, Endpoint("10.0.0.1:8000"), 2) == -2
    assert _sent(engine, Endpoint("10.0.0.2:8000", labels={"llm-d.ai/engine-type": "sglang"}), 2) == 2
    assert _sent(engine, Endpoint("10.0.0.3:8000", labels={"llm-d.ai/engine-type": "tgi"}), 2) is None
    assert _sent(engine, Endpoint("10.0.0.4:8000", labels={"llm-d.ai/engine-type": "nope"}), 2) == -2


def test_an_order_serves_a_pool_of_unknown_type():
    engine = _engine({"endpoints": ["a:1"], "engine_priority": {"order": "higher-first"}})
    assert _sent(engine, Endpoint("a:1"), -1) == -1


def test_the_value_is_the_objectives_engine_priority_else_its_priority():
    engine = _engine(
        {"endpoints": ["a:1"], "model_server_type": "vllm", "engine_priority": True},
        {"critical": {"priority": 5}, "batch": {"priority": -1, "engine_priority": -20}},
    )
    assert engine.priority(RoutingHints()) == 0
    assert engine.priority(RoutingHints(priority=5, objective="critical")) == 5
    assert engine.priority(RoutingHints(priority=-1, objective="batch")) == -20


# --- the configuration's checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"pool": {"endpoints": ["a:1"], "model_server_type": "llamacpp", "engine_priority": True}},
            "config: pool: engine_priority: model server type 'llamacpp' (model_server_type) takes no "
            "request priority (vllm and sglang do)",
        ),
        (
            {"pool": {"endpoints": ["a:1"], "model_server_type": "triton", "engine_priority": {}}},
            "model server type 'triton' (model_server_type) takes no request priority",
        ),
        (
            {"pool": {"endpoints": ["a:1", "b:2"], "engine_priority": True}},
            "config: pool: endpoints[0] (a:1): the form of the engine priority follows its model server "
            "type, which is 'auto'",
        ),
        (
            {
                "pool": {
                    "kubernetes": {"namespace": "llm", "inference_pool": "p"},
                    "engine_priority": True,
                }
            },
            "config: pool: engine_priority: the form of the priority follows the model server type, and "
            "model_server_type is 'auto'",
        ),
        (
            {
                "pool": {
                    "model_server_type": "vllm",
                    "endpoints": [{"address": "a:1", "model_server_type": "tgi", "engine_priority": True}],
                }
            },
            "config: pool: endpoints[0].engine_priority: model server type 'tgi' takes no request priority",
        ),
        (
            {"pool": {"endpoints": ["a:1"], "engine_priority": {"order": "first"}}},
            "pool.engine_priority.order: input should be 'lower-first' or 'higher-first'",
        ),
        (
            {"pool": {"endpoints": ["a:1"], "engine_priority": "yes"}},
            "pool.engine_priority: input should be a valid dictionary",
        ),
        (
            {
                "pool": {"endpoints": ["a:1"]},
                "objectives": {"batch": {"priority": -1, "engine_priority": -5}},
            },
            "config: objectives.batch.engine_priority is set, but no model server is sent a priority",
        ),
        (
            {"objectives": {"batch": {"engine_priority": True}}},
            "objectives.batch.engine_priority: input should be a valid integer",
        ),
        (
            {"objectives": {"batch": {"engine_priority": 2**63}}},
            "objectives.batch.engine_priority: input should be less than or equal to",
        ),
        (
            {
                "pool": {"endpoints": ["a:1"], "model_server_type": "vllm", "engine_priority": True},
                "objectives": {"huge": {"priority": -(2**63)}},
            },
            "objectives.huge.priority -9223372036854775808 is beyond the 64-bit priority",
        ),
    ],
)
def test_configuration_errors_say_what_to_do(data: dict[str, Any], message: str):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert message in str(info.value)


def test_what_the_checks_accept():
    for pool in (
        {"endpoints": ["a:1"], "model_server_type": "vllm", "engine_priority": True},
        {"endpoints": ["a:1"], "model_server_type": "llamacpp", "engine_priority": {"order": "lower-first"}},
        {"endpoints": [{"address": "a:1", "model_server_type": "sglang"}], "engine_priority": True},
        {
            "endpoints": [{"address": "a:1", "labels": {"llm-d.ai/engine-type": "vllm"}}],
            "engine_priority": True,
        },
        # a mixed pool: the llama.cpp endpoint is sent none
        {
            "endpoints": ["a:1", {"address": "b:1", "model_server_type": "llama.cpp"}],
            "model_server_type": "vllm",
            "engine_priority": True,
        },
        # on for one endpoint of a pool of another type
        {
            "endpoints": ["a:1", {"address": "b:1", "model_server_type": "vllm", "engine_priority": True}],
            "model_server_type": "tgi",
        },
    ):
        assert parse_config({"pool": pool}).pool is not None
