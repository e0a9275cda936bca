from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slorouter.pool.dialects import SGLANG, VLLM
from slorouter.pool.metrics_parser import ParseError, parse_metrics
from slorouter.pool.state import MetricsSnapshot

MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'

VLLM_PAGE = f"""\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",{MODEL}}} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",{MODEL}}} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",{MODEL}}} 0.625
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001",{MODEL}}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",{MODEL}}} 7.0
vllm:time_to_first_token_seconds_count{{engine="0",{MODEL}}} 7.0
vllm:time_to_first_token_seconds_sum{{engine="0",{MODEL}}} 1.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="27911"}} 1.0
"""

SGLANG_PAGE = f"""\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{{MODEL}}} 8.128902e+06
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{MODEL}}} 20.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{{{MODEL}}} 0.28
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{MODEL}}} 5.0
sglang:cache_config_info{{page_size="1",num_pages="161721"}} 1.0
"""


def test_vllm_page() -> None:
    assert parse_metrics(VLLM_PAGE) == MetricsSnapshot(
        waiting=3, running=12, kv_usage=0.625, block_size=16, num_gpu_blocks=27911
    )


def test_sglang_page() -> None:
    assert parse_metrics(SGLANG_PAGE) == MetricsSnapshot(
        waiting=5, running=20, kv_usage=0.28, block_size=1, num_gpu_blocks=161721
    )


def test_cache_info_is_optional() -> None:
    page = "sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n"
    assert parse_metrics(page) == MetricsSnapshot(waiting=1, running=2, kv_usage=0.5)


def test_older_vllm_kv_name_and_newer_one_preferred() -> None:
    old = VLLM_PAGE.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert parse_metrics(old).kv_usage == 0.625
    both = old + "vllm:kv_cache_usage_perc 0.25\n"
    assert parse_metrics(both).kv_usage == 0.25


def test_several_label_sets_sum_counts_and_average_kv() -> None:
    page = (
        'vllm:num_requests_waiting{engine="0",model_name="a"} 2.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="a"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="b"} 4.0\n'
        'vllm:num_requests_running{model_name="a"} 1.0\n'
        'vllm:num_requests_running{model_name="b"} 6.0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.6\n'
        'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="32",engine="1",num_gpu_blocks="150"} 1.0\n'
    )
    snapshot = parse_metrics(page)
    assert (snapshot.waiting, snapshot.running, snapshot.block_size, snapshot.num_gpu_blocks) == (
        9,
        7,
        32,
        250,
    )
    assert snapshot.kv_usage == pytest.approx(0.4)


def test_label_values_with_escapes_quotes_commas_and_braces() -> None:
    tricky = r'model_name="a\"b,c} 99",path="C:\\x\ny"'
    page = (
        f"vllm:num_requests_waiting{{{tricky}}} 4\n"
        f"vllm:num_requests_running{{{tricky},}} 5\n"
        f"vllm:kv_cache_usage_perc{{{tricky}}} 0.5\n"
        rf'vllm:cache_config_info{{note="block_size=\"99\",",block_size="16",num_gpu_blocks="7"}} 1.0'
        "\n"
    )
    assert parse_metrics(page) == MetricsSnapshot(
        waiting=4, running=5, kv_usage=0.5, block_size=16, num_gpu_blocks=7
    )


def test_unescaped_label_value_with_comma_and_brace() -> None:
    page = (
        "vllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n"
        'vllm:cache_config_info{x="a,b}",block_size="8",num_gpu_blocks="9",} 1\n'
    )
    snapshot = parse_metrics(page)
    assert (snapshot.block_size, snapshot.num_gpu_blocks) == (8, 9)


def test_comments_timestamps_crlf_and_first_line() -> None:
    page = (
        "vllm:num_requests_waiting 2 1700000000000\r\n"
        "# HELP vllm:num_requests_running comment mentioning vllm:num_requests_running 99\r\n"
        "vllm:num_requests_running\t3\r\n"
        'vllm:kv_cache_usage_perc{a="b"}   0.75   1700000000000\r\n'
    )
    assert parse_metrics(page) == MetricsSnapshot(waiting=2, running=3, kv_usage=0.75)


def test_longer_names_with_the_same_prefix_are_other_metrics() -> None:
    page = (
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 40\n'
        "vllm:num_requests_running_total 50\n"
        "vllm:num_requests_waiting 1\n"
        "vllm:num_requests_running 2\n"
        "vllm:kv_cache_usage_perc 0.5\n"
    )
    assert parse_metrics(page) == MetricsSnapshot(waiting=1, running=2, kv_usage=0.5)


def test_non_finite_samples_are_ignored() -> None:
    page = (
        'vllm:num_requests_waiting{e="0"} NaN\nvllm:num_requests_waiting{e="1"} 2\n'
        'vllm:num_requests_running{e="0"} +Inf\nvllm:num_requests_running{e="1"} 3\n'
        'vllm:kv_cache_usage_perc{e="0"} -Inf\nvllm:kv_cache_usage_perc{e="1"} 0.5\n'
        'vllm:cache_config_info{block_size="NaN",num_gpu_blocks="None"} 1\n'
    )
    assert parse_metrics(page) == MetricsSnapshot(waiting=2, running=3, kv_usage=0.5)


def test_only_non_finite_samples_count_as_missing() -> None:
    page = "vllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc NaN\n"
    assert parse_metrics(page).missing == ("kv_usage",)
    with pytest.raises(ParseError, match=r"kv_usage .*non-finite") as info:
        parse_metrics("vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc NaN\n")
    assert len(info.value.missing) == 3


def test_values_are_clamped() -> None:
    page = "vllm:num_requests_waiting -2\nvllm:num_requests_running 2.6\nvllm:kv_cache_usage_perc 1.5\n"
    assert parse_metrics(page) == MetricsSnapshot(waiting=0, running=3, kv_usage=1.0)


def test_a_missing_gauge_is_reported_not_an_error() -> None:
    page = VLLM_PAGE.replace("vllm:num_requests_running{", "vllm:other{")
    snapshot = parse_metrics(page)
    assert snapshot.missing == ("running",)
    assert (snapshot.waiting, snapshot.kv_usage, snapshot.block_size) == (3, 0.625, 16)


def test_a_page_without_any_load_metric_names_them_all() -> None:
    page = 'vllm:cache_config_info{block_size="16"} 1\n'
    with pytest.raises(ParseError, match="vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc"):
        parse_metrics(page, VLLM)


def test_sglang_page_missing_a_gauge_reports_the_sglang_signal() -> None:
    page = SGLANG_PAGE.replace("sglang:num_queue_reqs{", "sglang:other{")
    assert parse_metrics(page).missing == ("waiting",)
    with pytest.raises(ParseError, match=r"sglang metrics page lacks waiting \(sglang:num_queue_reqs\)"):
        parse_metrics("sglang:other 1\n", SGLANG)


@pytest.mark.parametrize(
    "page",
    ["", "not a metrics page at all", "\x00\x01garbage{{{", "<html><body>502 Bad Gateway</body></html>"],
)
def test_garbage_names_every_presets_gauges(page: str) -> None:
    with pytest.raises(ParseError, match="not a known model server") as info:
        parse_metrics(page)
    message = str(info.value)
    for name in ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "trtllm_num_requests_waiting",
                 "llamacpp:requests_deferred", "tgi_queue_size"):  # fmt: skip
        assert name in message


def test_comment_only_mentions_are_not_samples() -> None:
    page = "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n"
    with pytest.raises(ParseError, match="waiting"):
        parse_metrics(page)


@pytest.mark.parametrize(
    "line",
    [
        "vllm:num_requests_waiting abc",
        "vllm:num_requests_waiting ",
        'vllm:num_requests_waiting{model_name="x" 3',
    ],
)
def test_malformed_sample_lines(line: str) -> None:
    page = f"{line}\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n"
    with pytest.raises(ParseError, match="vllm:num_requests_waiting"):
        parse_metrics(page)


@pytest.mark.parametrize(
    "labels", ['{block_size="16"', '{block_size="16",num_gpu_blocks="8}', "{block_size=16}", '{="16"}']
)
def test_malformed_cache_info_labels(labels: str) -> None:
    page = "vllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n"
    with pytest.raises(ParseError, match="vllm:cache_config_info"):
        parse_metrics(page + f"vllm:cache_config_info{labels} 1\n")


def _reference(text: str) -> MetricsSnapshot:
    sums: dict[str, list[float]] = {}
    block_size = num_blocks = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                block_size = block_size or int(sample.labels["block_size"])
                num_blocks += int(sample.labels["num_gpu_blocks"])
            elif math.isfinite(sample.value):
                sums.setdefault(sample.name, []).append(sample.value)
    kv = sums["vllm:kv_cache_usage_perc"]
    return MetricsSnapshot(
        waiting=round(math.fsum(sums["vllm:num_requests_waiting"])),
        running=round(math.fsum(sums["vllm:num_requests_running"])),
        kv_usage=math.fsum(kv) / len(kv),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
    )


def test_agrees_with_prometheus_client_on_generated_pages() -> None:
    rng = np.random.default_rng(3)
    names = ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"]
    for _ in range(50):
        lines = []
        for name in ["vllm:num_requests_waiting_by_reason", *names, "vllm:e2e_request_latency_seconds"]:
            lines.append(f"# HELP {name} help text mentioning {name}")
            lines.append(f"# TYPE {name} gauge")
            for engine in range(int(rng.integers(1, 4))):
                value = float(rng.random()) if "kv" in name else float(rng.integers(0, 50))
                model = rng.choice(["m", 'a\\"b', "x,y}", "back\\\\slash"])
                lines.append(f'{name}{{engine="{engine}",model_name="{model}"}} {value}')
        for engine in range(int(rng.integers(1, 3))):
            blocks = int(rng.integers(1, 10_000))
            lines.append(
                f'vllm:cache_config_info{{block_size="16",engine="{engine}",num_gpu_blocks="{blocks}"}} 1'
            )
        text = "\n".join(lines) + "\n"
        ours, reference = parse_metrics(text), _reference(text)
        assert ours == MetricsSnapshot(
            waiting=reference.waiting,
            running=reference.running,
            kv_usage=pytest.approx(reference.kv_usage),
            block_size=reference.block_size,
            num_gpu_blocks=reference.num_gpu_blocks,
        )
