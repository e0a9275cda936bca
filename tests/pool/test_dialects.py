"""Each preset on a page shaped as that server writes it (names, labels, HELP/TYPE lines, several label
sets), detection, label-matched specs, configured overrides and their errors, and garbled pages (Hypothesis):
the parser returns a snapshot or raises ParseError naming the metrics, never anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from slorouter.pool.config import PoolConfig, dialect_resolver
from slorouter.pool.dialects import PRESETS, MetricSpec, parse_spec, preset
from slorouter.pool.metrics_parser import MAX_VALUE, ParseError, detect_dialect, parse_metrics
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState

# tensorrt_llm/metrics/collector.py: labels model_name, engine_type (trtllm-serve), no prefix separator.
TRTLLM_PAGE = """\
# HELP trtllm_num_requests_running Number of active requests
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="pytorch",model_name="Qwen/Qwen3-0.6B"} 7.0
# HELP trtllm_num_requests_waiting Number of queued requests
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{engine_type="pytorch",model_name="Qwen/Qwen3-0.6B"} 2.0
# HELP trtllm_kv_cache_utilization KV cache utilization
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="pytorch",model_name="Qwen/Qwen3-0.6B"} 0.055374130342183726
# HELP trtllm_kv_cache_max_blocks Maximum number of KV cache blocks
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{engine_type="pytorch",model_name="Qwen/Qwen3-0.6B"} 21129.0
# HELP trtllm_kv_cache_tokens_per_block Number of tokens per KV cache block
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{engine_type="pytorch",model_name="Qwen/Qwen3-0.6B"} 32.0
"""

# Triton's TensorRT-LLM backend (custom_metrics_reporter.cc): one family per group, a category label.
TRITON_PAGE = """\
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 6
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 100
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 400
"""

# llama.cpp's server: no labels; current releases have no KV-usage gauge.
LLAMACPP_PAGE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 9
"""
LLAMACPP_OLDER_KV = (
    "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.375\n"
)

# TGI's router (metrics crate): no labels, no KV-cache gauge.
TGI_PAGE = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 11
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 20480
"""

# Newer SGLang: cache geometry as two gauges; several dp ranks.
SGLANG_NEW_PAGE = """\
sglang:num_running_reqs{dp_rank="0",model_name="m"} 3.0
sglang:num_running_reqs{dp_rank="1",model_name="m"} 4.0
sglang:num_queue_reqs{dp_rank="0",model_name="m"} 1.0
sglang:num_queue_reqs{dp_rank="1",model_name="m"} 0.0
sglang:token_usage{dp_rank="0",model_name="m"} 0.2
sglang:token_usage{dp_rank="1",model_name="m"} 0.4
sglang:page_size{dp_rank="0",model_name="m"} 64.0
sglang:page_size{dp_rank="1",model_name="m"} 64.0
sglang:num_pages{dp_rank="0",model_name="m"} 1000.0
sglang:num_pages{dp_rank="1",model_name="m"} 1000.0
"""


@pytest.mark.parametrize(
    ("page", "dialect", "expected"),
    [
        (TRTLLM_PAGE, "trtllm-serve", MetricsSnapshot(2, 7, 0.055374130342183726, 32, 21129)),
        (TRITON_PAGE, "triton-tensorrt-llm", MetricsSnapshot(3, 6, 0.25, 64, 400)),
        (LLAMACPP_PAGE, "llamacpp", MetricsSnapshot(9, 4, 0.0, missing=("kv_usage",))),
        (LLAMACPP_PAGE + LLAMACPP_OLDER_KV, "llamacpp", MetricsSnapshot(9, 4, 0.375)),
        (TGI_PAGE, "tgi", MetricsSnapshot(5, 11, 0.0, missing=("kv_usage",))),
        (SGLANG_NEW_PAGE, "sglang", MetricsSnapshot(1, 7, pytest.approx(0.3), 64, 2000)),
    ],
    ids=["trtllm-serve", "triton", "llamacpp", "llamacpp-older", "tgi", "sglang-gauges"],
)
def test_presets_read_their_pages_and_are_detected(
    page: str, dialect: str, expected: MetricsSnapshot
) -> None:
    assert parse_metrics(page, preset(dialect)) == expected
    detected = detect_dialect(page)
    assert detected is not None and detected.name == dialect
    assert parse_metrics(page) == expected


def test_every_preset_detects_itself_on_a_page_of_its_specs() -> None:
    for name, dialect in PRESETS.items():
        page = "".join(
            f"{spec} 1\n"
            for signal in ("waiting", "running", "kv_usage")
            for spec in dialect.specs(signal)[:1]
        )
        detected = detect_dialect(page)
        assert detected is not None and detected.name == name


def test_triton_series_of_other_categories_are_not_read() -> None:
    page = TRITON_PAGE.replace('request_type="waiting"', 'request_type="paused"')
    assert parse_metrics(page, preset("triton")).missing == ("waiting",)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("vllm:num_requests_waiting", MetricSpec("vllm:num_requests_waiting")),
        ("a{b=c}", MetricSpec("a", (("b", "c"),))),
        ('a{ z = "x,y}" , b="1" }', MetricSpec("a", (("b", "1"), ("z", "x,y}")))),
    ],
)
def test_specs(text: str, spec: MetricSpec) -> None:
    assert parse_spec(text) == spec


@pytest.mark.parametrize("text", ["", "9abc", "a{b}", "a{b=c", 'a{b="1",b="2"}', "a b"])
def test_bad_specs(text: str) -> None:
    with pytest.raises(ValueError):
        parse_spec(text)


def test_overrides_replace_a_presets_specs_and_empty_reads_nothing() -> None:
    config = PoolConfig.model_validate(
        {
            "model_server_type": "vllm",
            "model_server_metrics": {"queued_requests": "my_queue{pool=a}", "kv_usage": ""},
            "endpoints": ["10.0.0.1:8000", {"address": "10.0.0.2:8000", "model_server_type": "sglang"}],
        }
    )
    resolve = dialect_resolver(config)
    first, second = resolve(Endpoint("10.0.0.1:8000")), resolve(Endpoint("10.0.0.2:8000"))
    assert first is not None and second is not None
    assert (first.name, second.name) == ("vllm+custom", "sglang+custom")  # the pool's overrides apply to both
    page = 'my_queue{pool="a"} 4\nmy_queue{pool="b"} 100\n'
    page += "vllm:num_requests_running 2\nvllm:kv_cache_usage_perc 1\n"
    assert parse_metrics(page, first) == MetricsSnapshot(4, 2, 0.0, missing=("kv_usage",))


def test_a_pod_label_names_its_type() -> None:
    resolve = dialect_resolver(PoolConfig.model_validate({"endpoints": ["10.0.0.1:8000"]}))
    labelled = resolve(Endpoint("10.0.0.9:8000", labels={"llm-d.ai/engine-type": "trtllm-serve"}))
    assert labelled is not None and labelled.name == "trtllm-serve"
    assert resolve(Endpoint("10.0.0.9:8000", labels={"llm-d.ai/engine-type": "nope"})) is None  # auto


@pytest.mark.parametrize(
    ("pool", "error"),
    [
        ({"model_server_type": "vllm2"}, "model_server_type\n.*'vllm2' is not a model server type"),
        ({"model_server_metrics": {"kv_usage": "x"}}, "model_server_metrics overrides a preset"),
        (
            {"model_server_type": "vllm", "model_server_metrics": {"kv_usage": "a{b"}},
            "model_server_metrics.kv_usage",
        ),
        ({"model_server_type": "vllm", "model_server_metrics": {"queue": "a"}}, "model_server_metrics.queue"),
        (
            {"endpoints": [{"address": "10.0.0.1:8000", "model_server_type": "x"}]},
            r"endpoints.0.model_server_type",
        ),
        ({"fallback_kv_capacity_tokens": 0}, "fallback_kv_capacity_tokens"),
    ],
)
def test_config_errors_name_the_key(pool: dict[str, object], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        PoolConfig.model_validate({"endpoints": ["10.0.0.1:8000"], **pool})


def test_estimates_follow_inflight_load_between_scrapes() -> None:
    pool = PoolState([Endpoint("a:1")], fallback_kv_capacity_tokens=1000)
    pool.set_metrics("a:1", MetricsSnapshot(0, 0, 0.0, missing=("waiting", "running", "kv_usage")), at=0.0)
    pool.add_inflight("a:1", 3, 400, 100)
    assert (pool.value("a:1", "waiting"), pool.value("a:1", "running"), pool.value("a:1", "kv_usage")) == (
        0,
        3,
        0.5,
    )
    pool.set_metrics("a:1", MetricsSnapshot(0, 1, 0.2, missing=("waiting",)), at=1.0)
    assert (pool.value("a:1", "waiting"), pool.value("a:1", "running")) == (2, 1)
    pool.add_inflight("a:1", -3, -400, -100)
    assert (pool.value("a:1", "waiting"), pool.value("a:1", "kv_usage")) == (0, 0.2)


# --- garbled pages of every preset -------------------------------------------------------------------------

_NAMES = sorted(
    {spec.name for d in PRESETS.values() for s in ("waiting", "running", "kv_usage") for spec in d.specs(s)}
)
_VALUES = st.one_of(
    st.integers(-10, 10**6).map(str),
    st.floats(allow_nan=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "x", ""]),
)
_LABELS = st.one_of(
    st.just(""),
    st.dictionaries(st.sampled_from(["request_type", "kv_cache_block_type", "model", "dp_rank"]),
                    st.sampled_from(["waiting", "active", "fraction", "max", "tokens_per", 'a"b', "x,y}"]),
                    max_size=3).map(lambda d: "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"),
    st.text(max_size=12).map(lambda t: "{" + t),
)  # fmt: skip
_LINES = st.one_of(
    st.tuples(st.sampled_from(_NAMES), _LABELS, _VALUES).map(lambda t: f"{t[0]}{t[1]} {t[2]}"),
    st.text(max_size=40),
    st.sampled_from(["# HELP x y", "# TYPE x gauge", ""]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_LINES, max_size=20), st.sampled_from([None, *PRESETS]))
def test_garbled_pages_of_any_preset_parse_or_raise_a_clear_error(
    lines: list[str], dialect: str | None
) -> None:
    page = "\n".join(lines)
    try:
        snapshot = parse_metrics(page, None if dialect is None else preset(dialect))
    except ParseError as exc:
        message = str(exc)
        assert message and ("lacks" in message or "not a known" in message or ":" in message)
        assert any(name in message for name in _NAMES) or "label" in message or "sample" in message, message
        return
    assert 0 <= snapshot.waiting <= MAX_VALUE and 0 <= snapshot.running <= MAX_VALUE
    assert 0.0 <= snapshot.kv_usage <= 1.0 and set(snapshot.missing) <= {"waiting", "running", "kv_usage"}
    pool = PoolState([Endpoint("a:1")])
    pool.set_metrics("a:1", snapshot, at=0.0)
