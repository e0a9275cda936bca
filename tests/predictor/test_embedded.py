"""Embedded mode: the same store, trainer and predictor in-process, behind the router's backend protocol."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slorouter.clock import ManualClock
from slorouter.predictor.backend import LatencyPredictorBackend, PredictionUnavailable
from slorouter.predictor.embedded import EmbeddedPredictor
from slorouter.predictor.features import FeatureError
from tests.helpers import predictor_models as common
from tests.helpers.predictor_models import FAST_TRAINING, eventually, feature_rows, synthetic

trained_dir = common.trained_dir


async def test_learns_in_the_background_then_predicts(tmp_path: Path) -> None:
    embedded = EmbeddedPredictor(tmp_path / "state", trainer_config=FAST_TRAINING)
    assert isinstance(embedded, LatencyPredictorBackend) and embedded.synchronous
    embedded.start()
    try:
        x_ttft, y_ttft, x_tpot, y_tpot = synthetic(400, seed=2)
        union = np.column_stack([x_ttft, x_tpot[:, -1]])  # both models' features, one matrix
        assert not embedded.ready
        with pytest.raises(PredictionUnavailable, match="no TTFT model"):
            await embedded.predict(union[:3])
        with pytest.raises(PredictionUnavailable, match="no TTFT model"):
            embedded.predict_now(union[:3])
        rows = feature_rows(x_ttft, x_tpot)
        for i in range(400):
            # Both row forms: feature mappings and the model's own matrix rows.
            embedded.add_sample("ttft", rows[i] if i % 2 else x_ttft[i], float(y_ttft[i]))
            embedded.add_sample("tpot", x_tpot[i] if i % 2 else rows[i], float(y_tpot[i]))
        assert embedded.store.count("ttft") == 400
        await eventually(lambda: all(embedded.predictor.versions.values()))
        assert embedded.ready
        assert embedded.versions == {k: embedded.trainer.current_version(k) for k in ("ttft", "tpot")}
        ttft, tpot = await embedded.predict(union[:50])
        want_ttft, want_tpot = embedded.predictor.predict(x_ttft[:50], x_tpot[:50])
        np.testing.assert_array_equal(ttft, want_ttft)
        np.testing.assert_array_equal(tpot, want_tpot)
        ttft, tpot = embedded.predict_now(union[:50])
        np.testing.assert_array_equal(ttft, want_ttft)
        np.testing.assert_array_equal(tpot, want_tpot)
        assert embedded.trainer.status()["models"]["ttft"]["trainings"] >= 1
    finally:
        await embedded.stop()


async def test_training_happens_off_the_event_loop(tmp_path: Path) -> None:
    embedded = EmbeddedPredictor(tmp_path / "state", trainer_config=FAST_TRAINING)
    threads: set[str] = set()
    original = embedded.trainer.train

    def spy(kind):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        return original(kind)

    embedded.trainer.train = spy  # type: ignore[method-assign]
    embedded.start()
    try:
        x_ttft, y_ttft, _, _ = synthetic(250)
        for i in range(250):
            embedded.add_sample("ttft", x_ttft[i], float(y_ttft[i]))
        await eventually(lambda: embedded.ready)
    finally:
        await embedded.stop()
    assert threads == {"slorouter-embedded-trainer"}


async def test_manual_cadence_in_virtual_time(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    config = replace(FAST_TRAINING, retrain_interval_s=5.0)
    embedded = EmbeddedPredictor(tmp_path / "state", trainer_config=config, clock=clock, background=False)
    embedded.start()  # no thread: the owner drives training
    try:
        x_ttft, y_ttft, x_tpot, _ = synthetic(600, seed=1)
        for i in range(300):
            embedded.add_sample("ttft", x_ttft[i], float(y_ttft[i]))
        assert [r.kind for r in embedded.maybe_train()] == ["ttft"]
        assert embedded.ready and embedded.predictor.versions["tpot"] is None
        union = np.column_stack([x_ttft[:2], x_tpot[:2, -1]])
        ttft, tpot = await embedded.predict(union)
        assert np.all(ttft > 0) and np.all(np.isnan(tpot))  # no TPOT model yet
        now_ttft, _ = embedded.predict_now(union)  # the same, without an event loop
        np.testing.assert_array_equal(now_ttft, ttft)
        for i in range(300, 600):
            embedded.add_sample("ttft", x_ttft[i], float(y_ttft[i]))
        assert embedded.maybe_train() == []  # not due: 0 s of virtual time passed
        clock.advance(5.0)
        assert [r.kind for r in embedded.maybe_train()] == ["ttft"]
    finally:
        await embedded.stop()


async def test_picks_up_models_already_in_the_state_directory(trained_dir: Path, tmp_path: Path) -> None:
    common.copy_models(trained_dir, tmp_path / "state" / "models")
    embedded = EmbeddedPredictor(tmp_path / "state", trainer_config=FAST_TRAINING, background=False)
    assert not embedded.ready  # nothing is read before start
    embedded.start()
    assert embedded.ready
    await embedded.stop()


async def test_temporary_model_directory_is_removed() -> None:
    embedded = EmbeddedPredictor(trainer_config=FAST_TRAINING)
    embedded.start()
    directory = embedded.state_dir
    assert embedded.model_dir.is_dir() and embedded.persistence is None
    await embedded.stop()
    assert not directory.exists()


async def test_sample_and_input_validation(tmp_path: Path) -> None:
    embedded = EmbeddedPredictor(tmp_path / "state", background=False)
    x_ttft, _, x_tpot, _ = synthetic(2)
    row = feature_rows(x_ttft, x_tpot)[0]
    with pytest.raises(ValueError, match="unknown model kind"):
        embedded.add_sample("e2e", row, 1.0)  # type: ignore[arg-type]
    with pytest.raises(FeatureError, match="latency_ms"):
        embedded.add_sample("ttft", row, -1.0)
    with pytest.raises(FeatureError, match="kv_cache_percentage"):
        embedded.add_sample("ttft", {**row, "kv_cache_percentage": -0.5}, 1.0)
    with pytest.raises(ValueError, match="7 values"):
        embedded.add_sample("tpot", x_ttft[0], 1.0)
    with pytest.raises(ValueError, match="9 features"):
        await embedded.predict(x_ttft)
    assert embedded.store.count("ttft") == 0
    await embedded.stop()
