"""Reading request traces: slorouter's own recordings, Mooncake's JSON Lines and Azure's LLM inference CSV.

Every format becomes the same ``TraceEntry`` list, in arrival order, with arrivals in seconds from the
first request:

- **slorouter** (``slorouter serve --record``, ``slorouter epp --record``): JSON Lines; each file opens
  with a header line ``{"format": "slorouter-trace", "version": 1, "recording": ID, "block_tokens": 16,
  ...}`` and every other line is one request (``arrival`` in epoch seconds, ``prompt_tokens``,
  ``max_tokens``, ``output_tokens``, ``slo_ttft_ms``, ``slo_tpot_ms``, ``priority``, ``block_hashes``, ...;
  docs/replay.md). Hashes are compared within their recording only. Rotated files may be concatenated.
- **mooncake** (kvcache-ai/Mooncake's FAST'25 traces): JSON Lines of ``{"timestamp": ms, "input_length":
  tokens, "output_length": tokens, "hash_ids": [ints]}``, one id per 512-token block of the prompt (the
  last one possibly partial); equal ids mean equal blocks.
- **azure** (Azure/AzurePublicDataset's AzureLLMInferenceTrace): CSV with a header row naming
  ``TIMESTAMP`` (``2023-11-16 18:17:03.9799600``), ``ContextTokens`` and ``GeneratedTokens``; no prefix
  information.

A line that cannot be read raises ``TraceError`` naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMATS = ("slorouter", "mooncake", "azure")
SLOROUTER_FORMAT = "slorouter-trace"
SLOROUTER_VERSION = 1
MOONCAKE_BLOCK_TOKENS = 512
# The smallest block a replay can give its own text (a tag naming the block fits in it).
MIN_BLOCK_TOKENS = 8
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ValueError):
    """A trace that cannot be read: the message names the file, and the line and field when it is one."""

    def __init__(self, path: Path, message: str, line: int | None = None, field: str | None = None):
        where = str(path) if line is None else f"{path}, line {line}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.field = field


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One request of a trace, in whatever format it came."""

    arrival: float  # seconds from the trace's first request
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[Hashable, ...] = ()  # one key per block of the prompt, from its start; equal = shared
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Trace:
    path: Path
    format: str
    block_tokens: int  # tokens per entry of ``TraceEntry.blocks`` (0: the format has none)
    entries: list[TraceEntry]


def read_trace(path: Path, format: str = "auto", block_tokens: int | None = None) -> Trace:
    """The trace in ``path``; ``format`` one of ``FORMATS`` or ``auto`` (from the first line).
    ``block_tokens`` overrides the format's block size (Mooncake's 512, a recording's header)."""
    if format not in ("auto", *FORMATS):
        raise TraceError(path, f"unknown trace format {format!r} (known: auto, {', '.join(FORMATS)})")
    if block_tokens is not None and block_tokens < MIN_BLOCK_TOKENS:
        raise TraceError(
            path, f"the block size must be at least {MIN_BLOCK_TOKENS} tokens, got {block_tokens}"
        )
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, not a trace file") from None
    except UnicodeDecodeError as exc:
        raise TraceError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise TraceError(path, f"cannot be read: {exc.strerror or exc}") from None
    if format == "auto":
        format = detect_format(path, text)
    if format == "slorouter":
        block, entries = _read_slorouter(path, text)
    elif format == "mooncake":
        block, entries = MOONCAKE_BLOCK_TOKENS, _read_mooncake(path, text)
    else:
        block, entries = 0, _read_azure(path, text)
    if not entries:
        raise TraceError(path, "holds no requests")
    entries.sort(key=lambda entry: entry.arrival)  # stable: simultaneous requests keep the file's order
    start = entries[0].arrival
    if start:
        entries = [_shifted(entry, start) for entry in entries]
    if block_tokens is not None and block:
        block = block_tokens
    return Trace(path, format, block, entries)


def detect_format(path: Path, text: str) -> str:
    """The format of a trace from its first non-blank line."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        raise TraceError(path, "is empty")
    if first.startswith("{"):
        try:
            head = json.loads(first)
        except ValueError:
            head = None
        if isinstance(head, dict):
            if head.get("format") == SLOROUTER_FORMAT:
                return "slorouter"
            if "hash_ids" in head or "input_length" in head:
                return "mooncake"
    columns = [name.strip() for name in first.split(",")]
    if all(name in columns for name in AZURE_COLUMNS):
        return "azure"
    raise TraceError(
        path,
        "unknown trace format: the first line is not a slorouter recording's header, a Mooncake JSON "
        f"line (hash_ids, input_length) or an Azure CSV header ({', '.join(AZURE_COLUMNS)}); "
        f"it starts {first[:60]!r}",
        line=1,
    )


def _shifted(entry: TraceEntry, start: float) -> TraceEntry:
    return TraceEntry(
        entry.arrival - start,
        entry.prompt_tokens,
        entry.output_tokens,
        entry.blocks,
        entry.slo_ttft_ms,
        entry.slo_tpot_ms,
        entry.priority,
    )


# --- fields ------------------------------------------------------------------------------------------
def _json_lines(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise TraceError(path, f"not valid JSON: {exc}", line=number) from None
        except RecursionError:
            raise TraceError(path, "not valid JSON: nested too deeply", line=number) from None
        if not isinstance(value, dict):
            raise TraceError(path, f"expected a JSON object, got {type(value).__name__}", line=number)
        yield number, value


def _count(path: Path, line: int, record: dict[str, Any], field: str) -> int:
    """A required non-negative integer (``12.0`` is taken as 12)."""
    if field not in record:
        raise TraceError(path, "missing", line, field)
    value = record[field]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(path, f"must be an integer, got {value!r}", line, field)
    if value < 0:
        raise TraceError(path, f"must not be negative, got {value}", line, field)
    return value


def _time(path: Path, line: int, record: dict[str, Any], field: str) -> float:
    if field not in record:
        raise TraceError(path, "missing", line, field)
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(path, f"must be a number, got {value!r}", line, field)
    if value < 0:
        raise TraceError(path, f"must not be negative, got {value}", line, field)
    return float(value)


def _optional_ms(path: Path, line: int, record: dict[str, Any], field: str) -> float | None:
    value = record.get(field)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise TraceError(
            path, f"must be a positive number of milliseconds or null, got {value!r}", line, field
        )
    return float(value)


def _int_list(path: Path, line: int, record: dict[str, Any], field: str) -> list[int]:
    value = record.get(field, [])
    if not isinstance(value, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    ):
        raise TraceError(path, "must be a list of integers", line, field)
    return value


# --- slorouter ---------------------------------------------------------------------------------------
def _read_slorouter(path: Path, text: str) -> tuple[int, list[TraceEntry]]:
    block_tokens = 0
    recording: str | None = None
    entries: list[TraceEntry] = []
    for number, record in _json_lines(path, text):
        if "format" in record:
            if record["format"] != SLOROUTER_FORMAT:
                raise TraceError(
                    path, f"expected {SLOROUTER_FORMAT!r}, got {record['format']!r}", number, "format"
                )
            if record.get("version") != SLOROUTER_VERSION:
                raise TraceError(
                    path,
                    f"version {record.get('version')!r} is not one this slorouter reads "
                    f"({SLOROUTER_VERSION})",
                    number,
                    "version",
                )
            size = _count(path, number, record, "block_tokens")
            if size < MIN_BLOCK_TOKENS or (block_tokens and size != block_tokens):
                raise TraceError(
                    path,
                    f"must be at least {MIN_BLOCK_TOKENS} and the same in every header, got {size}",
                    number,
                    "block_tokens",
                )
            block_tokens = size
            recording = str(record.get("recording", number))
            continue
        if recording is None:
            raise TraceError(path, "a request before the recording's header line", number)
        priority = record.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TraceError(path, f"must be an integer, got {priority!r}", number, "priority")
        output = record.get("output_tokens")
        tokens = _count(path, number, record, "output_tokens" if output is not None else "max_tokens")
        hashes = _int_list(path, number, record, "block_hashes")
        entries.append(
            TraceEntry(
                arrival=_time(path, number, record, "arrival"),
                prompt_tokens=_count(path, number, record, "prompt_tokens"),
                output_tokens=tokens,
                blocks=tuple((recording, h) for h in hashes),
                slo_ttft_ms=_optional_ms(path, number, record, "slo_ttft_ms"),
                slo_tpot_ms=_optional_ms(path, number, record, "slo_tpot_ms"),
                priority=priority,
            )
        )
    return block_tokens, entries


# --- Mooncake ----------------------------------------------------------------------------------------
def _read_mooncake(path: Path, text: str) -> list[TraceEntry]:
    entries = []
    for number, record in _json_lines(path, text):
        entries.append(
            TraceEntry(
                arrival=_time(path, number, record, "timestamp") / 1000,
                prompt_tokens=_count(path, number, record, "input_length"),
                output_tokens=_count(path, number, record, "output_length"),
                blocks=tuple(_int_list(path, number, record, "hash_ids")),
            )
        )
    return entries


# --- Azure -------------------------------------------------------------------------------------------
def _read_azure(path: Path, text: str) -> list[TraceEntry]:
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    columns = {name.strip(): i for i, name in enumerate(header or [])}
    missing = [name for name in AZURE_COLUMNS if name not in columns]
    if missing:
        raise TraceError(path, f"the CSV header lacks the column(s) {', '.join(missing)}", line=1)
    entries = []
    for number, row in enumerate(rows, 2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) < len(columns):
            raise TraceError(path, f"expected {len(columns)} columns, got {len(row)}", line=number)
        cells = {name: row[columns[name]].strip() for name in AZURE_COLUMNS}
        entries.append(
            TraceEntry(
                arrival=_azure_time(path, number, cells["TIMESTAMP"]),
                prompt_tokens=_azure_count(path, number, cells, "ContextTokens"),
                output_tokens=_azure_count(path, number, cells, "GeneratedTokens"),
            )
        )
    return entries


def _azure_time(path: Path, line: int, text: str) -> float:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(path, f"not a date and time, got {text!r}", line, "TIMESTAMP") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _azure_count(path: Path, line: int, cells: dict[str, str], field: str) -> int:
    try:
        value = int(cells[field])
    except ValueError:
        raise TraceError(path, f"must be an integer, got {cells[field]!r}", line, field) from None
    if value < 0:
        raise TraceError(path, f"must not be negative, got {value}", line, field)
    return value
