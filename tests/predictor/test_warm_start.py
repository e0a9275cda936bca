"""Warm start: the sample window on disk, the state directory, and what a restart refuses."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slorouter.clock import ManualClock
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.predictor.atomic import write_atomic
from slorouter.predictor.embedded import EmbeddedPredictor
from slorouter.predictor.features import FeatureSchema
from slorouter.predictor.live_check import LIVE_SAMPLES
from slorouter.predictor.pool_shape import PoolShape, PoolShapeMismatchError
from slorouter.predictor.sample_window import (
    WindowFileError,
    decode_window,
    max_file_bytes,
    read_window,
    save_window,
)
from slorouter.predictor.state_dir import SAMPLE_WINDOW, StateDirBusyError, default_state_dir, state_key
from slorouter.predictor.store import SampleStore, StoreConfig
from slorouter.predictor.warm_start import StatePersistence
from tests.helpers.predictor_models import H100, TRAINING, synthetic

H100_AND_A100 = PoolShape(((16, 17_187), (16, 29_205)))


def filled_store(n: int = 500, seed: int = 0, config: StoreConfig | None = None) -> SampleStore:
    store = SampleStore(config)
    x_ttft, y_ttft, x_tpot, y_tpot = synthetic(n, seed)
    store.add("ttft", x_ttft, y_ttft)
    for row, y in zip(x_tpot[:100], y_tpot[:100], strict=True):  # single rows too (the router's way)
        store.add_row("tpot", row, float(y))
    store.add("tpot", x_tpot[100:], y_tpot[100:])
    return store


def start_on(
    state_dir: Path, shape: PoolShape | None, registry: CollectorRegistry | None = None
) -> EmbeddedPredictor:
    embedded = EmbeddedPredictor(
        state_dir,
        trainer_config=TRAINING,
        background=False,
        pool_shape=None if shape is None else lambda: shape,
        registry=registry,
    )
    embedded.start()
    return embedded


async def run_and_stop(state_dir: Path, shape: PoolShape | None = H100) -> dict[str, str | None]:
    """A router's run that trained both models on ``shape``'s pool, then stopped (saving its window)."""
    embedded = start_on(state_dir, shape)
    x_ttft, y_ttft, x_tpot, y_tpot = synthetic(400, seed=3)
    embedded.store.add("ttft", x_ttft, y_ttft)
    embedded.store.add("tpot", x_tpot, y_tpot)
    assert len(embedded.maybe_train()) == 2
    await embedded.stop()
    return embedded.versions


# -- the file ------------------------------------------------------------------------------------------------


def test_atomic_write_keeps_the_old_file_when_writing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "file"
    write_atomic(target, b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, b"new" * 1000)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # no temporary file left behind


def test_window_round_trip_keeps_arrival_numbers_and_training_marks(tmp_path: Path) -> None:
    store = filled_store()
    store.mark_trained("ttft", 300)
    path = tmp_path / SAMPLE_WINDOW
    save_window(path, store, H100)
    window = read_window(path)
    assert (
        window is not None and window.pool_shape == H100.to_dict() and window.schema == store.schema.to_dict()
    )
    restored = SampleStore()
    for kind, saved in window.kinds.items():
        restored.restore(kind, saved.X, saved.y, saved.seq, saved.total_added, saved.trained_mark)
    for kind in ("ttft", "tpot"):
        a, b = store.snapshot(kind), restored.snapshot(kind)
        np.testing.assert_array_equal(a.X, b.X)
        np.testing.assert_array_equal(a.y, b.y)
        np.testing.assert_array_equal(a.seq, b.seq)  # the hold-out flags derive from these
        assert a.total_added == b.total_added
        assert store.added_since_training(kind) == restored.added_since_training(kind)
        assert store.bucket_counts(kind) == restored.bucket_counts(kind)
    restored.add_row("tpot", store.snapshot("tpot").X[0], 5.0)  # new samples continue the numbering
    assert restored.snapshot("tpot").seq[-1] == 500


def test_window_into_a_smaller_store_keeps_the_newest_per_bucket(tmp_path: Path) -> None:
    store = filled_store(3000)
    save_window(tmp_path / SAMPLE_WINDOW, store, None)
    window = read_window(tmp_path / SAMPLE_WINDOW)
    assert window is not None
    small = SampleStore(StoreConfig(per_bucket=2))
    saved = window.kinds["ttft"]
    small.restore("ttft", saved.X, saved.y, saved.seq, saved.total_added, 0)
    reference = SampleStore(StoreConfig(per_bucket=2))
    x_ttft, y_ttft, _, _ = synthetic(3000, 0)
    reference.add("ttft", x_ttft, y_ttft)
    np.testing.assert_array_equal(small.snapshot("ttft").seq, reference.snapshot("ttft").seq)


def test_damaged_window_files_are_refused(tmp_path: Path) -> None:
    store = filled_store()
    path = tmp_path / SAMPLE_WINDOW
    save_window(path, store, H100)
    data = path.read_bytes()
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    cases = {
        b"": "bad magic",
        b"not a window at all": "bad magic",
        data[:30]: "truncated",
        data[: len(data) // 2]: "truncated",
        data + b"x": "truncated",
        bytes(flipped): "checksum mismatch",
    }
    for damaged, message in cases.items():
        with pytest.raises(WindowFileError, match=message):
            decode_window(damaged)


def test_restore_rejects_inconsistent_samples() -> None:
    store = SampleStore()
    x, y, _, _ = synthetic(3)
    with pytest.raises(ValueError, match="must increase"):
        store.restore("ttft", x, y, np.array([0, 2, 1]), 3, 0)
    with pytest.raises(ValueError, match="must increase"):
        store.restore("ttft", x, y, np.array([0, 1, 2]), 2, 0)  # total_added below the arrival numbers
    with pytest.raises(ValueError, match="positive"):
        store.restore("ttft", x, -y, np.array([0, 1, 2]), 3, 0)
    with pytest.raises(ValueError, match="trained_mark"):
        store.restore("ttft", x, y, np.array([0, 1, 2]), 3, 4)
    assert store.count("ttft") == 0
    store.restore("ttft", x, y, np.array([0, 1, 2]), 3, 3)
    with pytest.raises(ValueError, match="empty store"):
        store.restore("ttft", x, y, np.array([0, 1, 2]), 3, 3)


def test_the_window_file_is_bounded_like_the_store(tmp_path: Path) -> None:
    config = StoreConfig(queue_buckets=2, kv_buckets=2, prefix_buckets=2, per_bucket=10)
    store = filled_store(5000, config=config)
    assert store.count("ttft") == store.capacity("ttft") == 80
    assert store.count("tpot") == store.capacity("tpot") == 40  # TPOT has no prefix buckets
    size = save_window(tmp_path / SAMPLE_WINDOW, store, H100)
    header = size - max_file_bytes(store)
    assert max_file_bytes(store) == 80 * (8 * 4 + 12) + 40 * (7 * 4 + 12)
    assert 0 < header < 2048
    # The default store: ≈ 10.8 MB at most (docs/predictor.md).
    assert max_file_bytes(SampleStore()) == 200_000 * 44 + 50_000 * 40 == 10_800_000


# -- the pool shape ------------------------------------------------------------------------------------------


def test_pool_shape_of_a_pool() -> None:
    pool = PoolState([Endpoint(f"10.0.0.{i}:8000") for i in range(4)])
    pool.set_metrics("10.0.0.0:8000", MetricsSnapshot(block_size=16, num_gpu_blocks=29_205), 0.0)
    pool.set_metrics("10.0.0.1:8000", MetricsSnapshot(block_size=16, num_gpu_blocks=29_205), 0.0)
    pool.set_metrics("10.0.0.2:8000", MetricsSnapshot(block_size=16, num_gpu_blocks=17_187), 0.0)
    # 10.0.0.3 has reported nothing yet: left out.
    assert PoolShape.of(pool) == H100_AND_A100
    assert PoolShape.from_dict(H100_AND_A100.to_dict()) == H100_AND_A100
    assert H100_AND_A100.covers(H100) and not H100.covers(H100_AND_A100) and H100.covers(PoolShape())
    assert H100.check_saved(H100_AND_A100.to_dict(), what="x") == H100_AND_A100  # lost a configuration: fits
    with pytest.raises(
        PoolShapeMismatchError, match=r"a pool of 29205 blocks of 16 tokens, but this pool also has 17187"
    ):
        H100_AND_A100.check_saved(H100.to_dict(), what="x")
    with pytest.raises(PoolShapeMismatchError, match="records no pool shape"):
        H100.check_saved(None, what="x")
    for bad in (
        {},
        {"kv_caches": [{"block_size": 16}]},
        {"kv_caches": [{"block_size": 0, "num_gpu_blocks": 1}]},
    ):
        with pytest.raises(ValueError, match="invalid pool shape"):
            PoolShape.from_dict(bad)


# -- restarts ------------------------------------------------------------------------------------------------


async def test_a_restart_serves_the_saved_models_and_resumes_training(tmp_path: Path) -> None:
    versions = await run_and_stop(tmp_path / "state")
    embedded = start_on(tmp_path / "state", H100)
    try:
        assert embedded.ready and embedded.versions == versions
        assert embedded.store.count("ttft") == 400 and embedded.store.count("tpot") == 400
        assert (
            embedded.trainer.current_version("ttft") == versions["ttft"]
        )  # the baseline of the next training
        assert embedded.maybe_train() == []  # nothing new since the saved models were trained
        x_ttft, y_ttft, _, _ = synthetic(LIVE_SAMPLES, seed=9)
        embedded.store.add("ttft", x_ttft[:-1], y_ttft[:-1])
        assert embedded.maybe_train() == []  # not retrained before its live check
        embedded.store.add("ttft", x_ttft[-1:], y_ttft[-1:])
        (report,) = embedded.maybe_train()  # the live check kept it: training resumes at once
        assert report.sample_count == 400 + LIVE_SAMPLES  # the saved window and the new samples
        assert report.current_version == versions["ttft"]
    finally:
        await embedded.stop()


async def test_models_and_window_of_another_pool_shape_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await run_and_stop(tmp_path / "state", H100)
    registry = CollectorRegistry()
    with caplog.at_level(logging.WARNING, "slorouter"):
        embedded = start_on(tmp_path / "state", H100_AND_A100, registry)
    try:
        assert not embedded.ready and embedded.store.count("ttft") == 0
        assert embedded.trainer.current_version("ttft") is None
        assert [(r.item, r.kind, r.reason) for r in embedded.persistence.report.refused] == [  # type: ignore[union-attr]
            ("model", "ttft", "pool_shape"),
            ("model", "tpot", "pool_shape"),
            ("samples", "all", "pool_shape"),
        ]
        # An expected refusal: once per item, a warning that says what follows, no error.
        assert [(r.levelname, r.getMessage().split(":")[1]) for r in caplog.records] == [
            ("WARNING", " refused the saved ttft model (pool_shape)"),
            ("WARNING", " refused the saved tpot model (pool_shape)"),
            ("WARNING", " refused the saved sample window (pool_shape)"),
        ]
        assert (
            caplog.records[0]
            .getMessage()
            .endswith(
                "; requests are routed by heuristics until a TTFT model is trained on this pool's samples"
            )
        )
        assert "but this pool also has 17187 blocks of 16 tokens" in caplog.text
        assert embedded.predictor.errors.keys() == {"ttft", "tpot"}  # recorded, though not logged again
        text = generate_latest(registry).decode()
        assert 'slorouter_predictor_warm_start_refused_total{item="model",reason="pool_shape"} 2.0' in text
        assert 'slorouter_predictor_warm_start_refused_total{item="samples",reason="pool_shape"} 1.0' in text
        # Warming up as from scratch: the first training replaces the refused models.
        x_ttft, y_ttft, _, _ = synthetic(300, seed=5)
        embedded.store.add("ttft", x_ttft, y_ttft)
        (report,) = embedded.maybe_train()
        assert report.accepted and report.reason == "first model" and embedded.ready
        metadata = embedded.predictor.metadata("ttft")
        assert metadata is not None and metadata.pool_shape == H100_AND_A100.to_dict()
    finally:
        await embedded.stop()


async def test_a_pool_that_lost_a_configuration_keeps_its_state(tmp_path: Path) -> None:
    await run_and_stop(tmp_path / "state", H100_AND_A100)
    embedded = start_on(tmp_path / "state", H100)  # the A100 replicas are down at the restart
    try:
        assert embedded.ready and embedded.store.count("ttft") == 400
        assert embedded.trainer.pool_shape == H100_AND_A100  # what the window holds samples of
    finally:
        await embedded.stop()
    window = read_window(tmp_path / "state" / SAMPLE_WINDOW)
    assert window is not None and window.pool_shape == H100_AND_A100.to_dict()


async def test_state_of_another_feature_schema_is_refused(tmp_path: Path) -> None:
    await run_and_stop(tmp_path / "state")
    # The same state, as a router of the next feature-schema version reads it.
    next_schema = FeatureSchema(version=FeatureSchema().version + 1)
    embedded = EmbeddedPredictor(
        tmp_path / "state",
        trainer_config=TRAINING,
        background=False,
        schema=next_schema,
        pool_shape=lambda: H100,
    )
    embedded.start()
    try:
        assert not embedded.ready and embedded.store.count("ttft") == 0
        reasons = {(r.item, r.reason) for r in embedded.persistence.report.refused}  # type: ignore[union-attr]
        assert reasons == {("model", "schema"), ("samples", "schema")}
    finally:
        await embedded.stop()


async def test_a_damaged_window_is_refused_and_the_models_still_serve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await run_and_stop(tmp_path / "state")
    path = tmp_path / "state" / SAMPLE_WINDOW
    path.write_bytes(path.read_bytes()[:1000])  # torn (not by us: our writes are atomic)
    with caplog.at_level(logging.WARNING, "slorouter.predictor.warm_start"):
        embedded = start_on(tmp_path / "state", H100)
    try:
        assert embedded.ready and embedded.store.count("ttft") == 0
        assert "refused the saved sample window (damaged): truncated sample-window file" in caplog.text
    finally:
        await embedded.stop()


async def test_a_damaged_model_is_refused_and_the_window_trains_at_once(tmp_path: Path) -> None:
    versions = await run_and_stop(tmp_path / "state")
    model_file = tmp_path / "state" / "models" / f"ttft-{versions['ttft']}.model"
    data = bytearray(model_file.read_bytes())
    data[-10] ^= 0xFF
    model_file.write_bytes(bytes(data))
    embedded = start_on(tmp_path / "state", H100)
    try:
        assert not embedded.ready and embedded.versions["tpot"] == versions["tpot"]
        assert [r.reason for r in embedded.persistence.report.refused] == ["damaged"]  # type: ignore[union-attr]
        # The restored TTFT samples have no model to show for them: they are trained on at once.
        assert [r.kind for r in embedded.maybe_train()] == ["ttft"] and embedded.ready
    finally:
        await embedded.stop()


async def test_models_saved_without_a_pool_shape_are_refused(tmp_path: Path) -> None:
    await run_and_stop(tmp_path / "state", shape=None)
    embedded = start_on(tmp_path / "state", H100)
    try:
        assert not embedded.ready
        assert {r.reason for r in embedded.persistence.report.refused} == {"pool_shape"}  # type: ignore[union-attr]
        assert "records no pool shape" in embedded.persistence.report.refused[0].error  # type: ignore[union-attr]
    finally:
        await embedded.stop()


def test_the_window_is_saved_periodically_when_samples_arrived(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    store = SampleStore()
    persistence = StatePersistence(tmp_path / SAMPLE_WINDOW, store, save_interval_s=60.0, clock=clock)
    x, y, _, _ = synthetic(10)
    store.add("ttft", x, y)
    clock.advance(59.0)
    assert not persistence.maybe_save()
    clock.advance(1.0)
    assert persistence.maybe_save() and read_window(tmp_path / SAMPLE_WINDOW).rows == 10  # type: ignore[union-attr]
    clock.advance(60.0)
    assert not persistence.maybe_save()  # nothing new
    store.add_row("ttft", x[0], 1.0)
    assert persistence.maybe_save() and persistence.saves == 2
    store.add_row("ttft", x[1], 1.0)
    clock.advance(30.0)
    assert not persistence.maybe_save()  # new, but within the interval
    assert persistence.save_pending()  # at shutdown: whatever the interval
    assert read_window(tmp_path / SAMPLE_WINDOW).rows == 12  # type: ignore[union-attr]
    assert not persistence.save_pending() and persistence.saves == 3  # nothing new: not rewritten


async def test_one_process_per_state_directory(tmp_path: Path) -> None:
    first = EmbeddedPredictor(tmp_path / "state", background=False)
    first.start()
    second = EmbeddedPredictor(tmp_path / "state", background=False)
    busy = f"in use by another slorouter process \\(pid {os.getpid()}\\)"
    with pytest.raises(StateDirBusyError, match=busy):
        second.start()
    await first.stop()
    second.start()  # released at stop: the second one takes it now
    with pytest.raises(StateDirBusyError, match=busy):
        EmbeddedPredictor(tmp_path / "state", background=False).start()
    await second.stop()


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir("serve") == tmp_path / "xdg" / "slorouter" / "serve"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", "relative/dir")  # not absolute: ignored, as the XDG spec says
    assert default_state_dir("serve") == tmp_path / "home" / ".local" / "state" / "slorouter" / "serve"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir("training-server") == tmp_path / "home/.local/state/slorouter/training-server"
    assert default_state_dir("serve", "embedded") == tmp_path / "home/.local/state/slorouter/serve/embedded"


def test_a_routers_state_key_is_its_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b").mkdir()
    assert state_key(None) == "embedded"
    key = state_key("pool.yaml")
    assert key.startswith("pool-") and len(key) == len("pool-") + 8
    assert state_key(tmp_path / "pool.yaml") == key  # the same file, however it is named
    assert state_key("b/../pool.yaml") == key
    assert state_key("b/pool.yaml") not in (key, "embedded")  # another file of the same name
    assert state_key("a config (copy).yaml").startswith("a_config_copy-")  # a safe directory name
