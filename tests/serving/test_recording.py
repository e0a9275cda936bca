"""The traffic recording of ``--record``: what a record holds (and does not), rotation, a failing disk."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from slorouter.clock import ManualClock
from slorouter.director import Director
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext, TargetPrediction
from slorouter.scheduling.types import InferenceRequest
from slorouter.serving.keyed_hash import siphash24
from slorouter.serving.record_file import RecordFile
from slorouter.serving.recording import BLOCK_TOKENS, RecordError, RecordSettings, TrafficRecorder

ADDRESSES = ["10.0.0.1:8000", "10.0.0.2:8000"]
SECRET = "The launch code is 0000; tell nobody. "


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


@pytest.fixture
def director(clock: ManualClock) -> Director:
    pool = PoolState([Endpoint(a) for a in ADDRESSES])
    for address in ADDRESSES:
        pool.set_metrics(address, MetricsSnapshot(kv_usage=0.1), at=clock.now())
    setup = build_scheduler_setup(None, PluginContext(clock=clock, rng=np.random.default_rng(0), pool=pool))
    return Director(pool, setup, InFlightTracker(pool), clock)


def _request(prompt: str, clock: ManualClock, **fields: object) -> InferenceRequest:
    values: dict = {"prompt_tokens": len(prompt) // 4, "max_tokens": 20, "received_at": clock.now()}
    values.update(fields)
    return InferenceRequest("r", "m", prompt, **values)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_record_holds_the_fields_and_hashes_but_no_text(
    tmp_path: Path, clock: ManualClock, director: Director
) -> None:
    path = tmp_path / "traffic.jsonl"
    recorder = TrafficRecorder(RecordSettings(path), clock)
    recorder.open()
    request = _request(
        SECRET * 10,
        clock,
        stream=True,
        slo_ttft_ms=500.0,
        priority=-1,
        headers={"x-gateway-inference-objective": "batch"},
    )
    lifecycle = director.dispatch(request, director.schedule(request))
    clock.advance(0.25)
    lifecycle.on_headers(200, True)
    lifecycle.on_tokens(1)
    clock.advance(0.09)
    lifecycle.on_tokens(9)
    lifecycle.end(usage={"prompt_tokens": request.prompt_tokens, "completion_tokens": 10})
    recorder.answered(lifecycle, "/v1/chat/completions")
    recorder.unanswered(_request("short", clock), "/v1/completions", 429)
    recorder.close()

    text = path.read_text()
    assert "launch" not in text and "nobody" not in text and "short" not in text
    header, answered, shed = _lines(path)
    assert header["format"] == "slorouter-trace" and header["version"] == 1
    assert header["block_tokens"] == BLOCK_TOKENS and header["recording"] == recorder.recording
    blocks = request.prompt_tokens // BLOCK_TOKENS
    assert answered == {
        "arrival": answered["arrival"],
        "api": "chat",
        "prompt_tokens": request.prompt_tokens,
        "max_tokens": 20,
        "output_tokens": 10,
        "stream": True,
        "slo_ttft_ms": 500.0,
        "slo_tpot_ms": None,
        "objective": "batch",
        "priority": -1,
        "status": 200,
        "endpoint": lifecycle.target.address,
        "route": "heuristic",
        "ttft_ms": pytest.approx(250.0),
        "tpot_ms": pytest.approx(10.0),
        "predicted_ttft_ms": None,
        "predicted_tpot_ms": None,
        "block_hashes": answered["block_hashes"],
    }
    assert len(answered["block_hashes"]) == blocks and len(set(answered["block_hashes"])) == blocks
    assert shed["status"] == 429 and shed["endpoint"] is None and shed["ttft_ms"] is None
    assert shed["api"] == "completions" and shed["block_hashes"] == []  # shorter than one block
    assert abs(answered["arrival"] - header["started"]) < 60  # wall-clock seconds


def test_the_prediction_routing_used_is_recorded_beside_the_outcome(
    director: Director, clock: ManualClock, tmp_path: Path
) -> None:
    path = tmp_path / "trace.jsonl"
    recorder = TrafficRecorder(RecordSettings(path), clock, interval_s=0.01)
    recorder.open()
    request = _request("predicted " * 40, clock)
    lifecycle = director.dispatch(request, director.schedule(request))
    # Served with the live-coverage factors in (2 and 1.5): recorded without them.
    lifecycle.prediction = TargetPrediction(300.0, 15.0, ttft_coverage_factor=2.0, tpot_coverage_factor=1.5)
    lifecycle.on_headers(200, False)
    lifecycle.on_tokens(1)
    lifecycle.end()
    recorder.answered(lifecycle, "/v1/completions")
    recorder.close()
    _, answered = _lines(path)
    assert answered["predicted_ttft_ms"] == 150.0 and answered["predicted_tpot_ms"] == 10.0


def test_hashes_follow_shared_prefixes_model_and_salt_within_one_recording(clock: ManualClock) -> None:
    recorder = TrafficRecorder(RecordSettings(Path("unused")), clock)
    shared = "s" * 64 * 3
    a = recorder.block_hashes(_request(shared + "a" * 128, clock))
    b = recorder.block_hashes(_request(shared + "b" * 128, clock))
    assert a[:3] == b[:3] and a[3] != b[3] and a[4] != b[4]  # shared exactly for the common blocks
    assert recorder.block_hashes(_request(shared + "a" * 128, clock, cache_salt="x"))[0] != a[0]
    other = TrafficRecorder(RecordSettings(Path("unused")), clock)
    assert other.block_hashes(_request(shared + "a" * 128, clock)) != a  # a recording's own key
    # Never more blocks than the prompt's token estimate holds.
    assert len(recorder.block_hashes(_request("x" * 640, clock, prompt_tokens=40))) == 40 // BLOCK_TOKENS


def test_the_file_rotates_and_keeps_the_backups_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"

    def encode(items: list[int]) -> list[str]:
        return [json.dumps({"i": item, "pad": "x" * 40}) for item in items]

    record = RecordFile(path, encode, lambda: '{"h":1}', max_bytes=200, backups=2)
    record.open()
    for i in range(20):
        record.add(i)
        record.flush()
    record.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["r.jsonl", "r.jsonl.1", "r.jsonl.2"]
    kept = []
    for name in ("r.jsonl.2", "r.jsonl.1", "r.jsonl"):
        lines = (tmp_path / name).read_text().splitlines()
        assert lines[0] == '{"h":1}'  # every file opens with the header
        assert (tmp_path / name).stat().st_size <= 200
        kept += [json.loads(line)["i"] for line in lines[1:]]
    assert kept == list(range(20 - len(kept), 20))  # the newest records, in order
    assert record.written == 20 and record.dropped == 0


def test_without_backups_the_file_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    record = RecordFile(path, lambda items: ["x" * 50] * len(items), lambda: "{}", max_bytes=120, backups=0)
    record.open()
    for i in range(5):
        record.add(i)
        record.flush()
    record.close()
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]
    assert path.stat().st_size <= 120


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failing_disk_is_logged_once_and_recording_stops(caplog: pytest.LogCaptureFixture) -> None:
    record = RecordFile(
        Path("/dev/full"), lambda items: ["x" * 10] * len(items), lambda: "", max_bytes=1 << 20
    )
    record._open_file = lambda: setattr(record, "_file", os.open("/dev/full", os.O_WRONLY))
    record.open()
    with caplog.at_level(logging.ERROR, logger="slorouter.serving.record_file"):
        for i in range(3):
            record.add(i)
            record.flush()
    record.add(3)  # refused without a try
    record.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "recording stops" in errors[0].getMessage()
    assert record.failed and record.written == 0 and record.dropped == 4


def test_a_file_that_cannot_be_opened_is_an_error_naming_the_flag(tmp_path: Path, clock: ManualClock) -> None:
    recorder = TrafficRecorder(RecordSettings(tmp_path / "missing" / "traffic.jsonl"), clock)
    with pytest.raises(RecordError, match=r"--record .*missing/traffic.jsonl: No such file"):
        recorder.open()


def test_a_full_queue_drops_new_records_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    record = RecordFile(
        tmp_path / "r.jsonl", lambda items: list(map(str, items)), lambda: "{}", max_pending=2
    )
    with caplog.at_level(logging.WARNING, logger="slorouter.serving.record_file"):
        for i in range(5):
            record.add(i)  # not opened: nothing drains the queue
    assert record.dropped == 3
    assert len([r for r in caplog.records if "dropping" in r.getMessage()]) == 1


def test_siphash_matches_the_reference_vector() -> None:
    # SipHash-2-4 of the 8 bytes 00..07 under the key 00..0f: 62 24 93 9a 79 f5 f5 93 (the paper's vectors).
    message = int.from_bytes(bytes(range(8)), "little")
    (value,) = siphash24(np.array([message], dtype=np.uint64), bytes(range(16))).tolist()
    assert value.to_bytes(8, "little").hex() == "6224939a79f5f593"
    with pytest.raises(ValueError, match="16-byte key"):
        siphash24(np.array([1], dtype=np.uint64), b"short")
