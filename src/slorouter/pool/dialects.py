"""Metric dialects: which series of a model server's ``/metrics`` page carry the router's load signals.

A dialect maps each signal (queue depth, running requests, KV-cache utilisation, cache geometry, LoRA info)
to a metric *spec*: a metric name with optional label matchers, written as a PromQL instant selector without
operators (``nv_trt_llm_request_metrics{request_type="waiting"}``; quotes around label values may be left
out), the form of the original's ``engineConfigs`` specs (llm-d ``core-metrics-extractor``). The built-in
presets and where each name comes from are listed in docs/configuration.md ("Model-server metrics").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# The load signals every scrape should produce; a page that lacks one is routed on the router's own
# in-flight counts for it (docs/configuration.md).
SIGNALS: tuple[str, ...] = ("waiting", "running", "kv_usage")

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^",}\s]+))\s*(,|$)')


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric name and the label values its samples must carry (every other label is free)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        return self.name + "{" + ",".join(f'{key}="{value}"' for key, value in self.labels) + "}"

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.labels)


# Every server process's start (prometheus_client's process collector; Go and Rust clients too).
PROCESS_START = MetricSpec("process_start_time_seconds")


def parse_spec(text: str) -> MetricSpec:
    """``name`` or ``name{label="value",...}`` (quotes optional) → ``MetricSpec``; else ``ValueError``."""
    if not isinstance(text, str):
        raise ValueError(f"expected a metric spec string, got {text!r}")
    spec = text.strip()
    name, brace, rest = spec.partition("{")
    name = name.strip()
    if not _METRIC_NAME.fullmatch(name):
        raise ValueError(f"{text!r}: {name!r} is not a Prometheus metric name")
    if not brace:
        return MetricSpec(name)
    if not rest.endswith("}"):
        raise ValueError(f"{text!r}: the label matchers must end with '}}'")
    body = rest[:-1]
    labels: dict[str, str] = {}
    pos = 0
    while body[pos:].strip():
        match = _MATCHER.match(body, pos)
        if match is None:
            raise ValueError(f'{text!r}: expected label="value" pairs separated by commas')
        key = match.group(1)
        value = match.group(2) if match.group(2) is not None else match.group(3)
        if key in labels:
            raise ValueError(f"{text!r}: label {key!r} appears twice")
        labels[key] = re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m[1], m[1]), value)
        pos = match.end()
        if not match.group(4):
            break
    return MetricSpec(name, tuple(sorted(labels.items())))


@dataclass(frozen=True, slots=True)
class Dialect:
    """Metric specs of one model-server family. Signal alternatives are tried in order (newest name first).

    The cache geometry comes either from an info gauge's labels (``cache_info`` with the label names, vLLM) or
    from plain gauges (``cache_block_size``/``cache_num_blocks``); both may be given, the gauges win.
    """

    name: str
    waiting: tuple[MetricSpec, ...] = ()
    running: tuple[MetricSpec, ...] = ()
    kv_usage: tuple[MetricSpec, ...] = ()
    cache_info: MetricSpec | None = None
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"
    cache_block_size: tuple[MetricSpec, ...] = ()
    cache_num_blocks: tuple[MetricSpec, ...] = ()
    lora_info: MetricSpec | None = None
    # A counter that moves while the server serves (the KV-event trust's evidence), if it has one.
    prefix_cache_queries: tuple[MetricSpec, ...] = ()

    def specs(self, signal: str) -> tuple[MetricSpec, ...]:
        specs: tuple[MetricSpec, ...] = getattr(self, signal)
        return specs

    def describe(self, signal: str) -> str:
        """The metric(s) a signal is read from, for messages: ``a or b``, or "no metric configured"."""
        specs = self.specs(signal)
        return " or ".join(str(spec) for spec in specs) if specs else "no metric configured"

    def metric_names(self) -> frozenset[str]:
        return frozenset(spec.name for signal in SIGNALS for spec in self.specs(signal))


def _specs(*texts: str) -> tuple[MetricSpec, ...]:
    return tuple(parse_spec(text) for text in texts)


VLLM = Dialect(
    name="vllm",
    waiting=_specs("vllm:num_requests_waiting"),
    running=_specs("vllm:num_requests_running"),
    kv_usage=_specs("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    cache_info=parse_spec("vllm:cache_config_info"),
    block_size_label="block_size",
    num_blocks_label="num_gpu_blocks",
    lora_info=parse_spec("vllm:lora_requests_info"),
    prefix_cache_queries=_specs("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
)
SGLANG = Dialect(
    name="sglang",
    waiting=_specs("sglang:num_queue_reqs"),
    running=_specs("sglang:num_running_reqs"),
    kv_usage=_specs("sglang:token_usage"),
    # Older SGLang: an info gauge with page_size/num_pages labels; newer: two plain gauges.
    cache_info=parse_spec("sglang:cache_config_info"),
    block_size_label="page_size",
    num_blocks_label="num_pages",
    cache_block_size=_specs("sglang:page_size"),
    cache_num_blocks=_specs("sglang:num_pages"),
)
TRTLLM_SERVE = Dialect(
    name="trtllm-serve",
    waiting=_specs("trtllm_num_requests_waiting"),
    running=_specs("trtllm_num_requests_running"),
    kv_usage=_specs("trtllm_kv_cache_utilization"),
    cache_block_size=_specs("trtllm_kv_cache_tokens_per_block"),
    cache_num_blocks=_specs("trtllm_kv_cache_max_blocks"),
)
TRITON_TRTLLM = Dialect(
    name="triton-tensorrt-llm",
    waiting=_specs('nv_trt_llm_request_metrics{request_type="waiting"}'),
    running=_specs('nv_trt_llm_request_metrics{request_type="active"}'),
    kv_usage=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'),
    cache_block_size=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"}'),
    cache_num_blocks=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"}'),
)
LLAMACPP = Dialect(
    name="llamacpp",
    waiting=_specs("llamacpp:requests_deferred"),
    running=_specs("llamacpp:requests_processing"),
    # Only older llama.cpp servers export it; newer ones are routed on in-flight tokens for KV.
    kv_usage=_specs("llamacpp:kv_cache_usage_ratio"),
)
TGI = Dialect(
    name="tgi",
    waiting=_specs("tgi_queue_size"),
    running=_specs("tgi_batch_current_size"),
    # TGI exports no KV-cache utilisation: routed on in-flight tokens for KV.
    kv_usage=(),
)

PRESETS: dict[str, Dialect] = {d.name: d for d in (VLLM, SGLANG, TRTLLM_SERVE, TRITON_TRTLLM, LLAMACPP, TGI)}
# Other names operators use for the same servers (the Helm chart's modelServerType, the original's engine
# names, the CLI's --engine).
ALIASES: dict[str, str] = {"trtllm": "trtllm-serve", "triton": "triton-tensorrt-llm", "llama.cpp": "llamacpp"}
AUTO = "auto"
MODEL_SERVER_TYPES: tuple[str, ...] = (AUTO, *PRESETS)


def preset(name: str) -> Dialect:
    """A built-in dialect by name or alias; ``ValueError`` lists the names."""
    key = ALIASES.get(name, name)
    if key not in PRESETS:
        expected = ", ".join(MODEL_SERVER_TYPES)
        raise ValueError(f"unknown model server type {name!r}: expected one of {expected}")
    return PRESETS[key]


def override(base: Dialect, **fields: object) -> Dialect:
    """``base`` with some specs replaced (named after the base, with a ``+custom`` suffix)."""
    if not fields:
        return base
    return replace(base, name=f"{base.name}+custom", **fields)  # type: ignore[arg-type]
