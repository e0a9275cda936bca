"""Read a model server's load signals out of its Prometheus text exposition.

This runs for every endpoint on every scrape (50 ms by default), and a real vLLM page is hundreds of lines,
mostly histogram buckets the router never reads. So instead of tokenizing every line (what
``prometheus_client.parser`` does), the parser ``str.find``-s each wanted metric name at a line start and
reads only that metric's sample lines. Comment lines never match, because the search is for a newline
directly followed by the name.

Rules, where the exposition allows a choice:

- A metric with several label sets (several ``model_name``, ``engine`` or ``dp_rank`` values) is combined
  into one value per server: request counts (waiting, running) are **summed**; the KV usage fraction is
  **averaged**, because each series is the fraction of its own (equally sized) cache and a sum could exceed 1;
  from cache-info series the block size is the first one's and the block count is summed (each data-parallel
  engine reports its own cache).
- NaN and ±Inf samples are ignored; a required metric whose samples are all non-finite counts as missing.
  Counts are rounded and floored at 0, the KV fraction is clamped to [0, 1].
- A finite sample beyond ±2**53 is a ``ParseError`` (no server has that many requests; the sum of such
  values overflows), and the combined counts are capped at 2**53, so they always fit the pool's int64
  columns. A cache-info label beyond 2**53 reads as 0 ("unknown").
- The text format requires all samples of one metric to be a single contiguous group (prometheus_client
  always writes them so); only the first group of a name is read.
- A non-numeric cache-info label (vLLM reports ``num_gpu_blocks="None"`` before profiling) reads as 0,
  which means "unknown" to the consumers of those columns.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from slorouter.pool.state import MetricsSnapshot


class ParseError(ValueError):
    """The page lacks a required metric or has a malformed sample line for one."""

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True, slots=True)
class Dialect:
    """Metric names of one model-server family. Alternatives are tried in order (newest name first)."""

    name: str
    prefix: str
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_usage: tuple[str, ...]
    cache_info: str
    block_size_label: str
    num_blocks_label: str


VLLM = Dialect(
    name="vllm",
    prefix="vllm:",
    waiting=("vllm:num_requests_waiting",),
    running=("vllm:num_requests_running",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    cache_info="vllm:cache_config_info",
    block_size_label="block_size",
    num_blocks_label="num_gpu_blocks",
)
SGLANG = Dialect(
    name="sglang",
    prefix="sglang:",
    waiting=("sglang:num_queue_reqs",),
    running=("sglang:num_running_reqs",),
    kv_usage=("sglang:token_usage",),
    cache_info="sglang:cache_config_info",
    block_size_label="page_size",
    num_blocks_label="num_pages",
)
DIALECTS: tuple[Dialect, ...] = (VLLM, SGLANG)

MAX_VALUE = 2**53  # the largest sample and count taken (exact in a float64, far within an int64)
_NAME_END = frozenset("{ \t")
_LABEL_PAIR = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*(?=,|$)'
)
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse a vLLM or SGLang ``/metrics`` page; raises ``ParseError`` naming what is missing or malformed."""
    for dialect in DIALECTS:
        name, lines = _first_group(text, dialect.waiting)
        if lines:
            return _parse(text, dialect, name, lines)
    # No dialect's waiting gauge: report the missing metrics of the family the page seems to come from.
    dialect = next((d for d in DIALECTS if d.prefix in text), DIALECTS[0])
    return _parse(text, dialect, dialect.waiting[0], [])


def _parse(text: str, dialect: Dialect, waiting_name: str, waiting_lines: list[str]) -> MetricsSnapshot:
    missing: list[str] = []
    waiting = _finite(waiting_name, waiting_lines)
    if not waiting:
        missing.append(_describe("waiting", dialect.waiting, bool(waiting_lines)))
    running_name, running_lines = _first_group(text, dialect.running)
    running = _finite(running_name, running_lines)
    if not running:
        missing.append(_describe("running", dialect.running, bool(running_lines)))
    kv_name, kv_lines = _first_group(text, dialect.kv_usage)
    kv = _finite(kv_name, kv_lines)
    if not kv:
        missing.append(_describe("kv_usage", dialect.kv_usage, bool(kv_lines)))
    if missing:
        raise ParseError(f"{dialect.name} metrics page lacks " + "; ".join(missing), tuple(missing))

    block_size = num_blocks = 0
    _, info_lines = _first_group(text, (dialect.cache_info,))
    for rest in info_lines:
        labels = _labels(dialect.cache_info, rest)
        if not block_size:
            block_size = _int_label(labels.get(dialect.block_size_label))
        num_blocks += _int_label(labels.get(dialect.num_blocks_label))

    return MetricsSnapshot(
        waiting=min(MAX_VALUE, max(0, round(math.fsum(waiting)))),
        running=min(MAX_VALUE, max(0, round(math.fsum(running)))),
        kv_usage=min(1.0, max(0.0, math.fsum(kv) / len(kv))),
        block_size=block_size,
        num_gpu_blocks=min(MAX_VALUE, num_blocks),
    )


def _describe(field: str, names: tuple[str, ...], present: bool) -> str:
    alternatives = " or ".join(names)
    return f"{field} ({alternatives}: only non-finite samples)" if present else f"{field} ({alternatives})"


def _first_group(text: str, names: tuple[str, ...]) -> tuple[str, list[str]]:
    """The first present name and its sample lines, each with the name cut off (``names[0], []`` if none)."""
    for name in names:
        lines = _group(text, name)
        if lines:
            return name, lines
    return names[0], []


def _group(text: str, name: str) -> list[str]:
    size = len(name)
    end_of_text = len(text)
    if text.startswith(name) and _ends_name(text, size):
        start = 0
    else:
        needle = "\n" + name
        pos = text.find(needle)
        # A longer metric name with this one as a prefix (say ``..._by_reason``) is a different metric.
        while pos >= 0 and not _ends_name(text, pos + 1 + size):
            pos = text.find(needle, pos + 1)
        if pos < 0:
            return []
        start = pos + 1
    lines: list[str] = []
    while True:
        end = text.find("\n", start)
        if end < 0:
            end = end_of_text
        lines.append(text[start + size : end])
        start = end + 1
        if start >= end_of_text or not text.startswith(name, start) or not _ends_name(text, start + size):
            return lines


def _ends_name(text: str, index: int) -> bool:
    return index < len(text) and text[index] in _NAME_END


def _finite(name: str, lines: list[str]) -> list[float]:
    values = []
    for rest in lines:
        value = _value(name, rest)
        if math.isfinite(value):
            if abs(value) > MAX_VALUE:
                raise ParseError(f"{name}: sample value {value:g} is out of range (at most 2**53)")
            values.append(value)
    return values


def _value(name: str, rest: str) -> float:
    """The sample value of one line; ``rest`` is the line after the metric name."""
    if rest[0] == "{":
        # The value and timestamp never contain "}", so the last one closes the label set, whatever the
        # (possibly escaped) label values hold.
        close = rest.rfind("}")
        if close < 0:
            raise ParseError(f"{name}: unterminated label set in {name}{rest!r}")
        tail = rest[close + 1 :]
    else:
        tail = rest
    fields = tail.split()
    if not fields:
        raise ParseError(f"{name}: sample line without a value: {name}{rest!r}")
    try:
        return float(fields[0])
    except ValueError:
        raise ParseError(f"{name}: sample value {fields[0]!r} is not a number") from None


def _labels(name: str, rest: str) -> dict[str, str]:
    """Label pairs of one sample line (``rest`` is the line after the metric name)."""
    if rest[0] != "{":
        return {}
    close = rest.rfind("}")
    if close < 0:
        raise ParseError(f"{name}: unterminated label set in {name}{rest!r}")
    body = rest[1:close]
    if "\\" in body:
        return _escaped_labels(name, body)
    # Without escapes every double quote delimits a value, so splitting on them alternates '[,]key='
    # separators and values.
    parts = body.split('"')
    if len(parts) % 2 == 0 or parts[-1].strip(" \t") not in ("", ","):
        raise ParseError(f"{name}: malformed label set in {name}{rest!r}")
    labels = {sep.strip(" \t,="): value for sep, value in zip(parts[0:-1:2], parts[1::2], strict=True)}
    if "" in labels:
        raise ParseError(f"{name}: label without a name in {name}{rest!r}")
    return labels


def _escaped_labels(name: str, body: str) -> dict[str, str]:
    """The slow path for label values with escapes (\\\\, \\", \\n), done with a regex."""
    labels: dict[str, str] = {}
    pos, size = 0, len(body)
    while body[pos:].strip(" \t"):
        match = _LABEL_PAIR.match(body, pos)
        if match is None:
            raise ParseError(f"{name}: malformed label set {{{body}}}")
        key, value = match.group(1, 2)
        labels[key] = _ESCAPE.sub(lambda m: _UNESCAPED.get(m[1], m[0]), value)
        pos = match.end()
        if pos < size:
            pos += 1  # the comma
    return labels


def _int_label(value: str | None) -> int:
    if value is None:
        return 0
    try:
        number = int(value)
    except ValueError:
        try:
            number = int(float(value))
        except (ValueError, OverflowError):
            return 0
    return number if 0 <= number <= MAX_VALUE else 0
