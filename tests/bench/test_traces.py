"""Traces as workloads: the three formats read back what was written, bad lines are named, and replayed
prompts share prefixes exactly where the traces' blocks are equal."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slorouter.bench.workloads.trace import replay
from slorouter.bench.workloads.trace_formats import Trace, TraceEntry, TraceError, read_trace

EPOCH = datetime.datetime(2024, 5, 10, 12, 0, tzinfo=datetime.UTC)
TEMP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def block_lists(draw: st.DrawFn, count: int) -> list[list[int]]:
    """Each list shares a prefix of an earlier one (or nothing), then has fresh ids: a prefix tree."""
    lists: list[list[int]] = []
    fresh = 0
    for _ in range(count):
        shared: list[int] = []
        if lists and draw(st.booleans()):
            parent = lists[draw(st.integers(0, len(lists) - 1))]
            shared = parent[: draw(st.integers(0, len(parent)))]
        extra = draw(st.integers(0, 4))
        lists.append(shared + list(range(fresh, fresh + extra)))
        fresh += extra
    return lists


@st.composite
def traces(draw: st.DrawFn) -> list[dict]:
    """Requests as a trace holds them: times in ms, lengths, block ids."""
    count = draw(st.integers(1, 12))
    blocks = draw(block_lists(count))
    return [
        {
            "ms": draw(st.integers(0, 10**7)),
            "prompt": draw(st.integers(0, 3000)),
            "output": draw(st.integers(0, 500)),
            "blocks": blocks[i],
            "slo": draw(st.none() | st.integers(1, 5000).map(float)),
            "priority": draw(st.integers(-2, 2)),
        }
        for i in range(count)
    ]


def _mooncake(requests: list[dict]) -> str:
    return "".join(
        json.dumps({"timestamp": r["ms"], "input_length": r["prompt"], "output_length": r["output"],
                    "hash_ids": r["blocks"]}) + "\n"
        for r in requests
    )  # fmt: skip


def _azure(requests: list[dict]) -> str:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for r in requests:
        moment = (EPOCH + datetime.timedelta(milliseconds=r["ms"])).strftime("%Y-%m-%d %H:%M:%S.%f")
        rows.append(f"{moment}0,{r['prompt']},{r['output']}")  # seven digits, as the published files
    return "\r\n".join(rows) + "\r\n"


def _slorouter(requests: list[dict], recording: str = "abc") -> str:
    lines = [
        json.dumps({"format": "slorouter-trace", "version": 1, "recording": recording, "block_tokens": 16})
    ]
    for r in requests:
        lines.append(
            json.dumps(
                {
                    "arrival": EPOCH.timestamp() + r["ms"] / 1000,
                    "api": "chat",
                    "prompt_tokens": r["prompt"],
                    "max_tokens": 999,
                    "output_tokens": r["output"],
                    "stream": True,
                    "slo_ttft_ms": r["slo"],
                    "slo_tpot_ms": None,
                    "objective": None,
                    "priority": r["priority"],
                    "status": 200,
                    "endpoint": "10.0.0.1:8000",
                    "route": "heuristic",
                    "ttft_ms": 12.5,
                    "tpot_ms": 3.0,
                    "block_hashes": r["blocks"],
                }
            )
        )
    return "\n".join(lines) + "\n"


WRITERS = {"mooncake": _mooncake, "azure": _azure, "slorouter": _slorouter}


def _expected(requests: list[dict], fmt: str) -> list[tuple[float, int, int, int]]:
    """(arrival, prompt, output, blocks) in arrival order, from the first request."""
    ordered = sorted(requests, key=lambda r: r["ms"])
    start = ordered[0]["ms"]
    blocks = (lambda r: 0) if fmt == "azure" else (lambda r: len(r["blocks"]))
    return [((r["ms"] - start) / 1000, r["prompt"], r["output"], blocks(r)) for r in ordered]


@pytest.mark.parametrize("fmt", list(WRITERS))
@TEMP
@given(requests=traces())
def test_every_format_reads_back_what_was_written(tmp_path: Path, fmt: str, requests: list[dict]) -> None:
    path = tmp_path / f"trace.{fmt}"
    path.write_text(WRITERS[fmt](requests), newline="")
    trace = read_trace(path)
    assert trace.format == fmt
    got = [(e.arrival, e.prompt_tokens, e.output_tokens, len(e.blocks)) for e in trace.entries]
    want = _expected(requests, fmt)
    assert [g[1:] for g in got] == [w[1:] for w in want]
    assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=2e-6)
    if fmt == "slorouter":
        ordered = sorted(requests, key=lambda r: r["ms"])
        assert [e.slo_ttft_ms for e in trace.entries] == [r["slo"] for r in ordered]
        assert [e.priority for e in trace.entries] == [r["priority"] for r in ordered]


# (field, bad value) per format; None: the field is left out.
BAD = {
    "mooncake": [("timestamp", None), ("timestamp", "soon"), ("input_length", -3), ("input_length", 2.5),
                 ("output_length", None), ("output_length", -1), ("hash_ids", "0,1"), ("hash_ids", [1, "a"])],
    "slorouter": [("arrival", None), ("arrival", -1), ("prompt_tokens", "many"), ("prompt_tokens", -5),
                  ("output_tokens", -2), ("block_hashes", {"a": 1}), ("slo_ttft_ms", -10),
                  ("priority", "high")],
    "azure": [("TIMESTAMP", "yesterday"), ("ContextTokens", "-7"), ("ContextTokens", "x"),
              ("GeneratedTokens", "")],
}  # fmt: skip


def _corrupt(fmt: str, text: str, index: int, field: str, value: object) -> tuple[str, int]:
    """The trace with request ``index`` made bad, and that request's line number."""
    lines = text.splitlines()
    if fmt == "azure":
        header = lines[0].split(",")
        cells = lines[index + 1].split(",")
        cells[header.index(field)] = str(value)
        lines[index + 1] = ",".join(cells)
        return "\n".join(lines) + "\n", index + 2
    offset = 1 if fmt == "slorouter" else 0
    record = json.loads(lines[index + offset])
    if value is None:
        del record[field]
    else:
        record[field] = value
    lines[index + offset] = json.dumps(record)
    return "\n".join(lines) + "\n", index + offset + 1


@pytest.mark.parametrize("fmt", list(WRITERS))
@TEMP
@given(requests=traces(), data=st.data())
def test_a_bad_line_is_named_by_line_and_field(
    tmp_path: Path, fmt: str, requests: list[dict], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(requests) - 1))
    field, value = data.draw(st.sampled_from(BAD[fmt]))
    text, line = _corrupt(fmt, WRITERS[fmt](requests), index, field, value)
    path = tmp_path / "bad.trace"
    path.write_text(text)
    with pytest.raises(TraceError) as raised:
        read_trace(path, fmt)
    assert (raised.value.line, raised.value.field) == (line, field)
    assert str(raised.value).startswith(f"{path}, line {line}, field {field!r}: ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("hello\n", "line 1: unknown trace format"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}\n[1]\n', "line 2: expected a JSON object"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{oops\n', "line 2: not valid JSON"),
        ('{"format": "slorouter-trace", "version": 9, "block_tokens": 16}\n', "field 'version'"),
        ('{"format": "slorouter-trace", "version": 1, "block_tokens": 16}\n', "holds no requests"),
        ('{"format": "slorouter-trace", "version": 1, "block_tokens": 2}\n', "field 'block_tokens'"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,5\n", "line 2: expected 3 columns"),
    ],
)
def test_unreadable_traces_say_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_a_missing_file_and_an_unknown_format_are_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "nothing.jsonl")
    (tmp_path / "t.jsonl").write_text(_mooncake([{"ms": 0, "prompt": 1, "output": 1, "blocks": []}]))
    with pytest.raises(TraceError, match="unknown trace format 'parquet'"):
        read_trace(tmp_path / "t.jsonl", "parquet")


def _common_blocks(a: str, b: str, chars: int = 64) -> int:
    """Leading ``chars``-character blocks two prompts share (the router's and the engine's blocks)."""
    n = 0
    while (
        n * chars + chars <= min(len(a), len(b))
        and a[n * chars : (n + 1) * chars] == b[n * chars : (n + 1) * chars]
    ):
        n += 1
    return n


def _shared_tokens(a: TraceEntry, b: TraceEntry, block: int) -> int:
    """Tokens two replayed prompts must share: their common blocks, as long as both hold them whole."""
    shared = 0
    left_a, left_b = a.prompt_tokens, b.prompt_tokens
    for key_a, key_b in zip(a.blocks, b.blocks, strict=False):
        size_a, size_b = min(block, left_a), min(block, left_b)
        if key_a != key_b or size_a <= 0 or size_b <= 0:
            break
        shared += min(size_a, size_b)
        if size_a != size_b:
            break
        left_a -= size_a
        left_b -= size_b
    return shared


@settings(max_examples=60, deadline=None)
@given(requests=traces(), block=st.sampled_from([16, 32, 64]))
def test_replayed_prompts_share_prefixes_exactly_where_the_blocks_are_equal(
    requests: list[dict], block: int
) -> None:
    for r in requests:
        r["prompt"] = max(r["prompt"], 1)
    entries = [
        TraceEntry(r["ms"] / 1000, r["prompt"], max(r["output"], 1), tuple(r["blocks"])) for r in requests
    ]
    entries.sort(key=lambda e: e.arrival)
    entries = [
        TraceEntry(e.arrival - entries[0].arrival, e.prompt_tokens, e.output_tokens, e.blocks)
        for e in entries
    ]
    result = replay(Trace(Path("t.jsonl"), "mooncake", block, entries))
    prompts = [request.prompt for request in result.requests]
    assert [len(p) for p in prompts] == [4 * e.prompt_tokens for e in entries]  # 4 characters a token
    for i, a in enumerate(entries):
        for j in range(i + 1, len(entries)):
            expected = _shared_tokens(a, entries[j], block) // 16
            assert _common_blocks(prompts[i], prompts[j]) == expected, (i, j)


def test_speed_duration_and_the_context_limit() -> None:
    entries = [
        TraceEntry(0.0, 100, 10),
        TraceEntry(2.0, 33000, 10),  # too long: its start is kept
        TraceEntry(4.0, 10, 40000),  # its output alone is too long: dropped
        TraceEntry(6.0, 50, 5),
        TraceEntry(10.0, 50, 5),
    ]
    trace = Trace(Path("t.jsonl"), "azure", 0, entries)
    fast = replay(trace, speed=2.0, max_model_len=32768)
    assert [r.arrival for r in fast.requests] == [0.0, 1.0, 3.0, 5.0]
    assert (fast.requests.clipped, fast.requests.dropped) == (1, 1)
    assert len(fast.requests[1].prompt) == 4 * (32768 - 10)
    assert fast.duration_s == pytest.approx(5.001) and fast.qps == pytest.approx(4 / 5.001)
    cut = replay(trace, speed=2.0, duration_s=3.0, max_model_len=32768)
    assert [r.arrival for r in cut.requests] == [0.0, 1.0] and cut.duration_s == 3.0
    assert cut.requests.name == "trace-t"
    with pytest.raises(ValueError, match="no request of the trace is left"):
        replay(trace, max_model_len=5)  # every output is longer than the context
