"""Microseconds per parse of a vLLM-sized /metrics page: slorouter's parser vs prometheus_client's.

The page is generated to look like a vLLM v1 server's (python/process collectors, vLLM gauges, counters and
latency/token histograms with ``engine`` and ``model_name`` labels, ``_created`` series, cache-config info,
HTTP instrumentator histograms). Run: ``.venv/bin/python benchmarks/bench_metrics_parse.py``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from slorouter.pool.metrics_parser import parse_metrics
from slorouter.pool.state import MetricsSnapshot

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
LATENCY_BUCKETS += [20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 131072]
HISTOGRAMS = {
    "vllm:iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    "vllm:request_prompt_tokens": TOKEN_BUCKETS,
    "vllm:request_generation_tokens": TOKEN_BUCKETS,
    "vllm:request_max_num_generation_tokens": TOKEN_BUCKETS,
    "vllm:request_params_n": [1, 2, 5, 10, 20],
    "vllm:request_params_max_tokens": TOKEN_BUCKETS,
    "vllm:time_to_first_token_seconds": LATENCY_BUCKETS,
    "vllm:time_per_output_token_seconds": LATENCY_BUCKETS[:17],
    "vllm:inter_token_latency_seconds": LATENCY_BUCKETS[:17],
    "vllm:e2e_request_latency_seconds": LATENCY_BUCKETS,
    "vllm:request_queue_time_seconds": LATENCY_BUCKETS,
    "vllm:request_inference_time_seconds": LATENCY_BUCKETS,
    "vllm:request_prefill_time_seconds": LATENCY_BUCKETS,
    "vllm:request_decode_time_seconds": LATENCY_BUCKETS,
}


def _histogram(lines: list[str], name: str, labels: str, buckets: list[float]) -> None:
    lines.append(f"# HELP {name} Histogram of {name}.")
    lines.append(f"# TYPE {name} histogram")
    count = 0
    for i, bound in enumerate(buckets):
        count += i * 3
        lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(count)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(count)}')
    lines.append(f"{name}_count{{{labels}}} {float(count)}")
    lines.append(f"{name}_sum{{{labels}}} {count * 0.731:.6f}")
    lines.append(f"# HELP {name}_created Histogram of {name}.")
    lines.append(f"# TYPE {name}_created gauge")
    lines.append(f"{name}_created{{{labels}}} 1.7624e+09")


def _simple(lines: list[str], name: str, kind: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} Number of {name}.")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        lines.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")


def vllm_page() -> str:
    base = f'engine="0",model_name="{MODEL}"'
    lines: list[str] = []
    for generation in range(3):
        _simple(
            lines, "python_gc_objects_collected_total", "counter", [(f'generation="{generation}"', 512.0)]
        )
    _simple(lines, "python_info", "gauge", [('implementation="CPython",major="3",minor="12"', 1.0)])
    for name in ("virtual_memory_bytes", "resident_memory_bytes", "start_time_seconds", "cpu_seconds_total"):
        _simple(lines, f"process_{name}", "gauge", [("", 1.2e10)])
    _simple(lines, "vllm:num_requests_running", "gauge", [(base, 37.0)])
    _simple(lines, "vllm:num_requests_waiting", "gauge", [(base, 4.0)])
    _simple(lines, "vllm:kv_cache_usage_perc", "gauge", [(base, 0.4172)])
    for name in (
        "prefix_cache_queries",
        "prefix_cache_hits",
        "num_preemptions",
        "prompt_tokens",
        "generation_tokens",
    ):
        _simple(lines, f"vllm:{name}_total", "counter", [(base, 8.128902e06)])
        _simple(lines, f"vllm:{name}_created", "gauge", [(base, 1.7624e09)])
    reasons = ("stop", "length", "abort", "error")
    _simple(
        lines,
        "vllm:request_success_total",
        "counter",
        [(f'{base},finished_reason="{r}"', 11.0) for r in reasons],
    )
    for name, buckets in HISTOGRAMS.items():
        _histogram(lines, name, base, buckets)
    info = 'block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9"'
    _simple(lines, "vllm:cache_config_info", "gauge", [(f'{info},num_gpu_blocks="27911",{base}', 1.0)])
    for handler in ("/v1/completions", "/v1/chat/completions", "/metrics", "/health"):
        labels = f'handler="{handler}",method="POST",status="2xx"'
        _simple(lines, "http_requests_total", "counter", [(labels, 1024.0)])
        _histogram(
            lines, "http_request_duration_seconds", f'handler="{handler}",method="POST"', [0.1, 0.5, 1]
        )
    _histogram(lines, "http_request_duration_highr_seconds", 'instance="router"', LATENCY_BUCKETS)
    return "\n".join(lines) + "\n"


def parse_with_prometheus_client(text: str) -> MetricsSnapshot:
    """The same extraction through prometheus_client's full text parser (vLLM names only)."""
    gauges: dict[str, float] = {}
    block_size = num_blocks = 0
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                block_size = block_size or int(sample.labels.get("block_size", 0))
                num_blocks += int(sample.labels.get("num_gpu_blocks", 0))
        elif family.name in (
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
        ):
            gauges[family.name] = math.fsum(s.value for s in family.samples)
    return MetricsSnapshot(
        waiting=round(gauges["vllm:num_requests_waiting"]),
        running=round(gauges["vllm:num_requests_running"]),
        kv_usage=gauges["vllm:kv_cache_usage_perc"],
        block_size=block_size,
        num_gpu_blocks=num_blocks,
    )


def _us_per_call(fn: Callable[[str], MetricsSnapshot], text: str, repeats: int, number: int) -> list[float]:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(number):
            fn(text)
        timings.append((time.perf_counter_ns() - start) / number / 1000)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000, help="parses per repeat for the fast parser")
    args = parser.parse_args()

    text = vllm_page()
    ours, reference = parse_metrics(text), parse_with_prometheus_client(text)
    if ours != reference:
        raise SystemExit(f"parsers disagree: {ours} != {reference}")
    print(f"page: {text.count(chr(10))} lines, {len(text)} bytes; parsed: {ours}")
    rows = [
        ("slorouter parse_metrics", parse_metrics, args.number),
        ("prometheus_client parser", parse_with_prometheus_client, max(1, args.number // 50)),
    ]
    medians = {}
    for label, fn, number in rows:
        timings = _us_per_call(fn, text, args.repeats, number)
        medians[label] = statistics.median(timings)
        spread = f"min {min(timings):9.1f}   ({number}×{args.repeats})"
        print(f"{label:<26} median {medians[label]:9.1f} µs/parse   {spread}")
    ratio = medians["prometheus_client parser"] / medians["slorouter parse_metrics"]
    print(f"speed-up: {ratio:.0f}×")


if __name__ == "__main__":
    main()
