"""A simulated pod's ``/metrics`` page, with vLLM V1's metric names, labels, help texts and buckets, or
(``engine``) the load metrics of SGLang, trtllm-serve or llama.cpp's server as those servers name and label
them (their sources: docs/configuration.md, "Model-server metrics"), for mixed-engine pools.

The router scrapes every pod every 50 ms, so the page is rendered by hand (about 30 µs; prometheus-client
takes several times that): gauges and counters are read from the engine at scrape time, and each
histogram's text is re-rendered only after it changed. Labels are sorted by name, as prometheus-client
writes them.
"""

from __future__ import annotations

import bisect
import time

from slorouter.sim.engine import Engine, Finished, FirstToken
from slorouter.sim.gauges import GaugeReporter

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vllm/v1/metrics/loggers.py
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{name}="{_escape(value)}"' for name, value in sorted(labels.items()))


class _Histogram:
    __slots__ = (
        "_bounds", "_counts", "_dirty", "_labels_text", "_le_labels", "_name", "_prefix", "_sum", "_text"
    )  # fmt: skip

    def __init__(self, name: str, help_text: str, bounds: tuple[float, ...], labels: dict[str, str]) -> None:
        self._name = name
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._prefix = f"# HELP {name} {help_text}\n# TYPE {name} histogram\n"
        self._labels_text = _labels(labels)
        self._le_labels = [_labels({**labels, "le": repr(float(b))}) for b in bounds]
        self._le_labels.append(_labels({**labels, "le": "+Inf"}))
        self._dirty = True
        self._text = ""

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value
        self._dirty = True

    @property
    def count(self) -> int:
        return sum(self._counts)

    def render(self) -> str:
        if self._dirty:
            lines = [self._prefix]
            cumulative = 0
            name = self._name
            for labels, count in zip(self._le_labels, self._counts, strict=True):
                cumulative += count
                lines.append(f"{name}_bucket{{{labels}}} {float(cumulative)!r}\n")
            lines.append(f"{name}_count{{{self._labels_text}}} {float(cumulative)!r}\n")
            lines.append(f"{name}_sum{{{self._labels_text}}} {self._sum!r}\n")
            self._text = "".join(lines)
            self._dirty = False
        return self._text


# Metric pages the simulator serves (``slorouter sim --engine``).
ENGINES: tuple[str, ...] = ("vllm", "sglang", "trtllm", "llamacpp")


class PodMetrics:
    """Observes one engine's request events and renders its Prometheus page (``dialect``: one of ENGINES)."""

    def __init__(self, engine: Engine, model_name: str, dialect: str = "vllm") -> None:
        if dialect not in ENGINES:
            raise ValueError(f"unknown metrics engine {dialect!r}: expected one of {', '.join(ENGINES)}")
        self.dialect = dialect
        self._model_name = model_name
        self._engine = engine
        self.gauges = GaugeReporter(engine)  # late or coarse gauges, as the engine's profile says
        # As prometheus_client's process collector reports it: a restarted pod shows a new value.
        self.process_start_s = time.time()
        labels = {"model_name": model_name, "engine": "0"}
        self._label_text = "{" + _labels(labels) + "}"
        self._success_labels = "{" + _labels({**labels, "finished_reason": "length"}) + "}"
        self.ttft = _Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
            labels,
        )
        self.e2e = _Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
            labels,
        )
        self.queue = _Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
            labels,
        )
        cache_labels = {
            "block_size": str(engine.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "engine": "0",
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(engine.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
        }
        self._static = (
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f"vllm:cache_config_info{{{_labels(cache_labels)}}} 1.0\n"
        )

    def first_token(self, event: FirstToken) -> None:
        self.ttft.observe(event.ttft)

    def finished(self, event: Finished) -> None:
        self.e2e.observe(event.e2e)
        self.queue.observe(event.queue_time)

    def render(self, now: float = 0.0) -> str:
        """The page at ``now`` (the server's clock; only late or coarse gauges depend on it)."""
        if self.dialect != "vllm":
            return self._render_other(now)
        engine = self._engine
        labels = self._label_text
        gauges = self.gauges.read(now)
        values = (gauges.running, gauges.waiting, gauges.kv_usage)
        parts = [
            f"{header}{name}{labels} {float(value)!r}\n"
            for (name, header), value in zip(_GAUGE_SERIES, values, strict=True)
        ]
        parts += [
            f"{header}{name}{labels} {float(getattr(engine, attribute))!r}\n"
            for name, header, attribute in _ENGINE_SERIES
        ]
        parts.append(
            "# HELP vllm:request_success_total Count of successfully processed requests.\n"
            "# TYPE vllm:request_success_total counter\n"
            f"vllm:request_success_total{self._success_labels} {float(engine.num_finished_total)!r}\n"
        )
        parts.append(self._static)
        parts.append(
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {self.process_start_s!r}\n"
        )
        parts.append(self.ttft.render())
        parts.append(self.e2e.render())
        parts.append(self.queue.render())
        return "".join(parts)

    def _render_other(self, now: float) -> str:
        """The same engine's load on another server's page: only the series a router reads, plus the token
        counters, as that server writes them (names, labels, HELP texts)."""
        engine = self._engine
        gauges = self.gauges.read(now)
        blocks = engine.num_gpu_blocks
        used = round(gauges.kv_usage * blocks)
        if self.dialect == "sglang":  # python/sglang/srt/metrics/collector.py (labels: model_name, ...)
            labels = "{" + _labels({"model_name": self._model_name}) + "}"
            rows: tuple[tuple[str, str, str, float], ...] = (
                ("sglang:num_running_reqs", "gauge", "The number of running requests.", gauges.running),
                ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                 gauges.waiting),
                ("sglang:token_usage", "gauge", "The token usage.", gauges.kv_usage),
                ("sglang:page_size", "gauge", "KV cache page size in tokens.", engine.block_size),
                ("sglang:num_pages", "gauge", "Number of KV cache pages.", blocks),
                ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                 engine.prompt_tokens_total),
                ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                 engine.generation_tokens_total),
            )  # fmt: skip
        elif self.dialect == "trtllm":  # tensorrt_llm/metrics/collector.py (labels: model_name, engine_type)
            labels = "{" + _labels({"engine_type": "pytorch", "model_name": self._model_name}) + "}"
            rows = (
                ("trtllm_num_requests_running", "gauge", "Number of active requests", gauges.running),
                ("trtllm_num_requests_waiting", "gauge", "Number of queued requests", gauges.waiting),
                ("trtllm_kv_cache_utilization", "gauge", "KV cache utilization", gauges.kv_usage),
                ("trtllm_kv_cache_max_blocks", "gauge", "Maximum number of KV cache blocks", blocks),
                ("trtllm_kv_cache_free_blocks", "gauge", "Number of free KV cache blocks", blocks - used),
                ("trtllm_kv_cache_used_blocks", "gauge", "Number of used KV cache blocks", used),
                ("trtllm_kv_cache_tokens_per_block", "gauge", "Number of tokens per KV cache block",
                 engine.block_size),
                ("trtllm_prompt_tokens_total", "counter",
                 "Cumulative number of prompt (input) tokens processed.", engine.prompt_tokens_total),
                ("trtllm_generation_tokens_total", "counter",
                 "Cumulative number of generation (output) tokens produced.", engine.generation_tokens_total),
            )  # fmt: skip
        else:  # llama.cpp's server (no labels); the KV gauges as its releases that still export them
            labels = ""
            kv_rows = (
                ("llamacpp:kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                 gauges.kv_usage),
                ("llamacpp:kv_cache_tokens", "gauge", "KV-cache tokens.", used * engine.block_size),
            ) if engine.profile.llamacpp_kv_metrics else ()  # fmt: skip
            rows = (
                ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
                 engine.prompt_tokens_total),
                ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
                 engine.generation_tokens_total),
                *kv_rows,
                ("llamacpp:requests_processing", "gauge", "Number of requests processing.", gauges.running),
                ("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", gauges.waiting),
            )  # fmt: skip
        return "".join(
            f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name}{labels} {float(value)!r}\n"
            for name, kind, help_text, value in rows
        )


def _series(name: str, kind: str, help_text: str, attribute: str) -> tuple[str, str, str]:
    return name, f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n", attribute


# The load gauges (name, HELP and TYPE lines), in Gauges order running, waiting, KV usage.
_GAUGE_SERIES = tuple(
    _series(*row)[:2]
    for row in (
        ("vllm:num_requests_running", "gauge",
         "Number of requests in model execution batches.", "num_running"),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "num_waiting"),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
    )
)  # fmt: skip
# (name, HELP and TYPE lines, Engine attribute holding the value)
_ENGINE_SERIES = tuple(
    _series(*row)
    for row in (
        ("vllm:prefix_cache_queries_total", "counter",
         "Prefix cache queries, in terms of number of queried tokens.", "prefix_cache_queries"),
        ("vllm:prefix_cache_hits_total", "counter",
         "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits"),
        ("vllm:num_preemptions_total", "counter",
         "Cumulative number of preemption from the engine.", "num_preemptions_total"),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt_tokens_total"),
        ("vllm:generation_tokens_total", "counter",
         "Number of generation tokens processed.", "generation_tokens_total"),
    )
)  # fmt: skip
