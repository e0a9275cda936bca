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
  from cache-info series (or cache gauges) the block size is the first one's and the block count is summed
  (each data-parallel engine reports its own cache).
- Which metrics carry the signals is the endpoint's dialect (``slorouter.pool.dialects``: vLLM, SGLang,
  TensorRT-LLM, llama.cpp, TGI, or configured); a spec with label matchers reads only the matching series.
  A signal the page lacks is reported in ``MetricsSnapshot.missing``, not an error: the pool then fills it
  from the router's in-flight counts. A page with none of its dialect's signals is a ``ParseError``.
- NaN and ±Inf samples are ignored; a signal whose samples are all non-finite counts as missing. Counts
  are rounded and floored at 0, the KV fraction is clamped to [0, 1].
- A finite sample beyond ±2**53 is a ``ParseError`` (no server has that many requests; the sum of such
  values overflows), and the combined counts are capped at 2**53, so they always fit the pool's int64
  columns. A cache-info label beyond 2**53 reads as 0 ("unknown").
- The text format requires all samples of one metric to be a single contiguous group (prometheus_client
  always writes them so); only the first group of a name is read.
- ``process_start_time_seconds`` and the dialect's prefix-cache query counter (summed) are read when the
  page has them, for the KV-event trust; a malformed sample of either is ignored, never a ``ParseError``.
- A non-numeric cache-info label (vLLM reports ``num_gpu_blocks="None"`` before profiling) reads as 0,
  which means "unknown" to the consumers of those columns.
"""

from __future__ import annotations

import math
import re

from slorouter.pool.dialects import PRESETS, PROCESS_START, SIGNALS, Dialect, MetricSpec
from slorouter.pool.state import MetricsSnapshot


class ParseError(ValueError):
    """The page has none of its dialect's load metrics, or a malformed sample line for one."""

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


MAX_VALUE = 2**53  # the largest sample and count taken (exact in a float64, far within an int64)
_NAME_END = frozenset("{ \t")
_LABEL_PAIR = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*(?=,|$)'
)
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def detect_dialect(text: str, candidates: tuple[Dialect, ...] = tuple(PRESETS.values())) -> Dialect | None:
    """The candidate with the most of its load signals on the page (the first of a tie); ``None`` if no
    candidate has any."""
    best, best_count = None, 0
    for dialect in candidates:
        count = sum(1 for signal in SIGNALS if _select(text, dialect.specs(signal))[1])
        if count > best_count:
            best, best_count = dialect, count
    return best


def parse_metrics(text: str, dialect: Dialect | None = None) -> MetricsSnapshot:
    """Read the load signals of ``dialect`` (detected from the page when ``None``) out of a ``/metrics`` page.

    A signal the page lacks is listed in the snapshot's ``missing`` (the router then routes on its own
    in-flight counts for it); a page with none of them, or a malformed sample line of a metric read, raises
    ``ParseError`` naming the metrics.
    """
    if dialect is None:
        dialect = detect_dialect(text)
        if dialect is None:
            known = "; ".join(
                f"{d.name}: " + ", ".join(str(s) for signal in SIGNALS for s in d.specs(signal))
                for d in PRESETS.values()
            )
            raise ParseError(
                "not a known model server's metrics page: it has none of the load metrics of any "
                f"preset ({known})",
                SIGNALS,
            )
    return _parse(text, dialect)


def _parse(text: str, dialect: Dialect) -> MetricsSnapshot:
    missing: list[str] = []
    described: list[str] = []
    values: dict[str, list[float]] = {}
    for signal in SIGNALS:
        spec, lines = _select(text, dialect.specs(signal))
        finite = _finite(str(spec), lines) if spec is not None else []
        if finite:
            values[signal] = finite
        else:
            missing.append(signal)
            described.append(_describe(signal, dialect, bool(lines)))
    if not values:
        raise ParseError(f"{dialect.name} metrics page lacks " + "; ".join(described), tuple(described))

    block_size = num_blocks = 0
    _, size_lines = _select(text, dialect.cache_block_size)
    size_values = _finite("cache block size", size_lines) if size_lines else []
    _, count_lines = _select(text, dialect.cache_num_blocks)
    count_values = _finite("cache block count", count_lines) if count_lines else []
    if size_values or count_values:
        block_size = _int_value(size_values[0]) if size_values else 0
        num_blocks = sum(_int_value(v) for v in count_values)
    elif dialect.cache_info is not None:
        info = dialect.cache_info
        for rest in _matching(info, _group(text, info.name)):
            labels = _labels(info.name, rest)
            if not block_size:
                block_size = _int_label(labels.get(dialect.block_size_label))
            num_blocks += _int_label(labels.get(dialect.num_blocks_label))

    waiting = values.get("waiting", [0.0])
    running = values.get("running", [0.0])
    kv = values.get("kv_usage", [0.0])
    return MetricsSnapshot(
        waiting=min(MAX_VALUE, max(0, round(math.fsum(waiting)))),
        running=min(MAX_VALUE, max(0, round(math.fsum(running)))),
        kv_usage=min(1.0, max(0.0, math.fsum(kv) / len(kv))),
        block_size=block_size,
        num_gpu_blocks=min(MAX_VALUE, num_blocks),
        missing=tuple(missing),
        process_start_s=_first(text, (PROCESS_START,)),
        prefix_cache_queries=_sum(text, dialect.prefix_cache_queries),
    )


def _optional(text: str, specs: tuple[MetricSpec, ...]) -> list[float]:
    """The finite samples of an optional metric (none when absent or malformed: it never fails a scrape)."""
    spec, lines = _select(text, specs)
    if spec is None or not lines:
        return []
    try:
        return _finite(str(spec), lines)
    except ParseError:
        return []


def _first(text: str, specs: tuple[MetricSpec, ...]) -> float | None:
    values = _optional(text, specs)
    return values[0] if values else None


def _sum(text: str, specs: tuple[MetricSpec, ...]) -> float | None:
    values = _optional(text, specs)
    return math.fsum(values) if values else None


def _describe(signal: str, dialect: Dialect, present: bool) -> str:
    names = dialect.describe(signal)
    return f"{signal} ({names}: only non-finite samples)" if present else f"{signal} ({names})"


def _select(text: str, specs: tuple[MetricSpec, ...]) -> tuple[MetricSpec | None, list[str]]:
    """The first spec with samples on the page and their sample lines (name cut off), else ``(first, [])``."""
    for spec in specs:
        lines = _matching(spec, _group(text, spec.name))
        if lines:
            return spec, lines
    return (specs[0] if specs else None), []


def _matching(spec: MetricSpec, lines: list[str]) -> list[str]:
    if not spec.labels or not lines:
        return lines
    return [rest for rest in lines if spec.matches(_labels(spec.name, rest))]


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


def _int_value(value: float) -> int:
    return int(value) if 0 <= value <= MAX_VALUE else 0


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
