"""The Prometheus text parser (a model server's /metrics page) on generated pages: valid ones (label
escapes, several label sets, timestamps, CRLF) parse into values the pool can store; damaged ones (values
replaced, lines cut, dropped or spliced in, random text) parse or raise ``ParseError`` naming the metric;
nothing else is raised. Then the regressions of the defects the fuzzing found (docs/reliability.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from slorouter.pool.metrics_parser import MAX_VALUE, ParseError, parse_metrics
from slorouter.pool.state import Endpoint, PoolState
from tests.fuzz.strategies import METRICS_CASES, TextCase, check_metrics


@settings(max_examples=300, deadline=None)
@given(METRICS_CASES)
def test_generated_pages(case: TextCase) -> None:
    check_metrics(case)


RUNNING_KV = "vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.1\n"


@pytest.mark.parametrize(
    "page",
    [
        # math.fsum raised OverflowError on these two (the sum overflows a float).
        'vllm:num_requests_waiting{a="1"} 1e308\nvllm:num_requests_waiting{a="2"} 1e308\n' + RUNNING_KV,
        'vllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc{a="1"} 1e308\n'
        'vllm:kv_cache_usage_perc{a="2"} 1e308\n',
        # parsed, then OverflowError when the pool stored it (int64 columns).
        "vllm:num_requests_waiting 1e300\n" + RUNNING_KV,
        "vllm:num_requests_waiting -1e300\n" + RUNNING_KV,
    ],
    ids=["waiting-sum", "kv-sum", "huge-waiting", "huge-negative"],
)
def test_samples_beyond_2_53_are_a_parse_error_naming_the_metric(page):
    with pytest.raises(ParseError, match=r"out of range \(at most 2\*\*53\)"):
        parse_metrics(page)


def test_counts_and_cache_info_always_fit_the_pool():
    lines = [f'vllm:num_requests_waiting{{engine="{i}"}} {MAX_VALUE}' for i in range(3)]
    info = 'vllm:cache_config_info{block_size="1e300",num_gpu_blocks="99999999999999999999999"} 1\n'
    snapshot = parse_metrics("\n".join(lines) + "\n" + RUNNING_KV + info)
    assert snapshot.waiting == MAX_VALUE
    assert (snapshot.block_size, snapshot.num_gpu_blocks) == (0, 0)  # unknown, as a non-numeric label
    many = "".join(f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{MAX_VALUE}",e="{i}"}} 1\n'
                   for i in range(3))  # fmt: skip
    assert parse_metrics(lines[0] + "\n" + RUNNING_KV + many).num_gpu_blocks == MAX_VALUE
    pool = PoolState([Endpoint("10.0.0.1:8000")])
    pool.set_metrics("10.0.0.1:8000", snapshot, at=0.0)  # raised OverflowError before
    assert int(pool.columns["waiting"][0]) == MAX_VALUE
