from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from slorouter.clock import ManualClock
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.predictor import Predictor, PredictorNotReady
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import (
    Trainer,
    TrainerConfig,
    booster_predict_ms,
    calibration_flags,
    conformal_offset,
    holdout_flags,
    holdout_metrics,
)
from tests.helpers.predictor_models import synthetic


def test_holdout_flags_are_reproducible_and_about_the_fraction() -> None:
    seq = np.arange(100_000)
    flags = holdout_flags(seq, 0.1)
    assert flags.mean() == pytest.approx(0.1, abs=0.002)
    np.testing.assert_array_equal(flags, holdout_flags(seq, 0.1))
    assert not holdout_flags(seq, 0.0).any()
    assert flags[:1000].mean() == pytest.approx(0.1, abs=0.02)  # evenly spread, not clumped


def test_holdout_metrics() -> None:
    y = np.array([100.0, 200.0, 400.0, 50.0])
    pred = np.array([110.0, 180.0, 400.0, 100.0])
    m = holdout_metrics(y, pred, 0.9)
    assert m["mape"] == pytest.approx((0.1 + 0.1 + 0.0 + 1.0) / 4)
    assert m["mae"] == pytest.approx((10 + 20 + 0 + 50) / 4)
    assert m["coverage"] == pytest.approx(0.75)  # 200 > 180
    # pinball: under-prediction by 20 costs 0.9*20, over-predictions cost 0.1 each
    assert m["pinball_loss"] == pytest.approx((0.1 * 10 + 0.9 * 20 + 0 + 0.1 * 50) / 4)
    assert holdout_metrics(np.array([]), np.array([]), 0.9) == {}


def test_no_model_before_training(trainer: Trainer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    predictor = Predictor(trainer.model_store)
    assert not predictor.refresh() and not predictor.ready
    assert predictor.versions == {"ttft": None, "tpot": None}
    with pytest.raises(PredictorNotReady):
        predictor.predict(np.zeros((1, 8), np.float32), np.zeros((1, 7), np.float32))
    x, y, _, _ = synthetic(199)
    trainer.store.add("ttft", x, y)
    assert not trainer.due("ttft") and trainer.train("ttft") is None  # too few samples: nothing saved
    assert trainer.maybe_train() == []
    assert trainer.model_store.latest_version("ttft") is None
    assert list((tmp_path / "models").iterdir()) == []


def test_gating_by_min_samples_and_cadence(trainer: Trainer, clock: ManualClock) -> None:
    x, y, xt, yt = synthetic(400)
    trainer.store.add("ttft", x[:150], y[:150])
    assert not trainer.due("ttft")
    trainer.store.add("ttft", x[150:], y[150:])
    assert trainer.due("ttft") and not trainer.due("tpot")
    reports = trainer.maybe_train()
    assert [r.kind for r in reports] == ["ttft"] and reports[0].accepted
    assert reports[0].reason == "first model"
    assert not trainer.due("ttft")  # no new samples
    trainer.store.add("ttft", x[:10], y[:10])
    assert not trainer.due("ttft")  # new samples, but the interval has not passed
    clock.advance(4.9)
    assert not trainer.due("ttft")
    clock.advance(0.1)
    assert trainer.due("ttft")
    trainer.store.add("tpot", xt, yt)
    assert {r.kind for r in trainer.maybe_train()} == {"ttft", "tpot"}
    assert trainer.maybe_train() == []


def test_an_expedited_kind_is_due_without_its_interval(trainer: Trainer) -> None:
    x, y, _, _ = synthetic(400)
    trainer.store.add("ttft", x, y)
    trainer.maybe_train()
    trainer.expedite("ttft")
    assert not trainer.due("ttft")  # nothing new to learn from yet
    trainer.store.add("ttft", x[:10], y[:10])
    assert trainer.due("ttft")  # the interval has not passed


def test_training_saves_model_with_metadata(trainer: Trainer) -> None:
    x, y, _, _ = synthetic(2000)
    trainer.store.add("ttft", x, y)
    report = trainer.train("ttft")
    assert report is not None and report.accepted
    assert report.holdout_count == pytest.approx(200, abs=40)
    assert report.calibration_count == pytest.approx(200, abs=40)
    assert report.train_count + report.holdout_count + report.calibration_count == 2000
    assert set(report.metrics) >= {"mape", "mae", "coverage", "pinball_loss", "rmse", "offset"}
    raw, meta = trainer.model_store.load("ttft")  # type: ignore[misc]
    assert meta.version == report.version == trainer.current_version("ttft")
    assert meta.sample_count == report.train_count and meta.objective == "conformal" and meta.quantile == 0.9
    assert meta.schema == trainer.schema.to_dict() and meta.target_transform == "log"
    assert meta.offset == report.metrics["offset"] > 0
    assert meta.metrics == report.metrics and raw
    status = trainer.status()
    json.dumps(status)
    assert status["models"]["ttft"]["version"] == report.version
    assert status["models"]["ttft"]["samples"] == 2000
    assert sum(status["models"]["ttft"]["buckets"].values()) == 2000
    assert status["models"]["ttft"]["last_training_duration_s"] > 0
    assert status["models"]["tpot"]["version"] is None


def test_not_clearly_worse_rule(tmp_path, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    config = TrainerConfig(n_estimators=60, min_samples=200, nthread=1)
    store = SampleStore()
    trainer = Trainer(store, ModelStore(tmp_path), config, clock)
    x, y, _, _ = synthetic(3000, seed=1)
    store.add("ttft", x, y)
    first = trainer.train("ttft")
    assert first is not None and first.accepted
    # Same data, same seed: an equally good model is accepted (within the 5 % tolerance).
    store.add("ttft", x[:1], y[:1])
    again = trainer.train("ttft")
    assert again is not None and again.accepted and again.current_version == first.version
    assert again.current_metrics is not None
    assert again.metrics["pinball_loss"] <= 1.05 * again.current_metrics["pinball_loss"]
    # A crippled trainer (2 trees, no linear baseline) on the same store: clearly worse, rejected.
    weak = Trainer(store, trainer.model_store, replace(config, n_estimators=2, baseline=False), clock)
    assert weak.current_version("ttft") == again.version  # picked up from the model store
    store.add("ttft", x[:1], y[:1])
    rejected = weak.train("ttft")
    assert rejected is not None and not rejected.accepted and rejected.version is None
    assert rejected.reason.startswith("clearly worse")
    assert trainer.model_store.latest_version("ttft") == again.version
    assert weak.status()["models"]["ttft"]["rejected"] == 1


def test_objective_change_replaces_model(trainer: Trainer, clock: ManualClock) -> None:
    x, y, _, _ = synthetic(1000)
    trainer.store.add("ttft", x, y)
    assert trainer.train("ttft").accepted  # type: ignore[union-attr]
    mean = Trainer(trainer.store, trainer.model_store, replace(trainer.config, objective="mean"), clock)
    trainer.store.add("ttft", x[:1], y[:1])
    report = mean.train("ttft")
    assert report is not None and report.accepted and "not comparable" in report.reason
    assert trainer.model_store.load("ttft")[1].target_transform == "identity"  # type: ignore[index]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="objective"):
        TrainerConfig(objective="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quantile"):
        TrainerConfig(quantile=1.0)


def test_conformal_offset_is_the_finite_sample_quantile() -> None:
    residuals = np.arange(1, 101, dtype=np.float64)[::-1]  # 100 values, order must not matter
    assert conformal_offset(residuals, 0.9) == 91.0  # ⌈101 × 0.9⌉ = 91st smallest
    assert conformal_offset(residuals[:9], 0.9) == 100.0  # ⌈10 × 0.9⌉ = 9th of 9: the largest
    assert conformal_offset(np.empty(0), 0.9) == 0.0


def test_calibration_and_holdout_bands_are_disjoint_and_sized() -> None:
    seq = np.arange(100_000, dtype=np.int64)
    hold, calib = holdout_flags(seq, 0.1), calibration_flags(seq, 0.1)
    assert not np.any(hold & calib)
    assert hold.mean() == pytest.approx(0.1, abs=0.005) and calib.mean() == pytest.approx(0.1, abs=0.005)


def test_conformal_p90_covers_fresh_samples(tmp_path, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    trainer = Trainer(SampleStore(), ModelStore(tmp_path), TrainerConfig(n_estimators=60, nthread=1), clock)
    x, y, _, _ = synthetic(6000, seed=1)
    trainer.store.add("ttft", x, y)
    report = trainer.train("ttft")
    assert report is not None and report.calibration_count > 0
    current = trainer._state["ttft"].current
    assert current is not None
    fresh_x, fresh_y, _, _ = synthetic(4000, seed=2)
    p90 = booster_predict_ms(current.booster, fresh_x, "log", current.metadata.offset, current.baseline)
    assert 0.85 <= float(np.mean(fresh_y <= p90)) <= 0.95
    point = booster_predict_ms(current.booster, fresh_x, "log", baseline=current.baseline)
    assert 0.35 <= float(np.mean(fresh_y <= point)) <= 0.65


def test_boosting_loop_is_xgb_train() -> None:
    import xgboost as xgb

    from slorouter.predictor.trainer import _boost

    x, y, _, _ = synthetic(2000, seed=4)
    params = TrainerConfig(nthread=1).xgb_params()
    dtrain = xgb.QuantileDMatrix(x, label=np.log(y).astype(np.float32), max_bin=256, nthread=1)
    expected = xgb.train(params, dtrain, num_boost_round=30)
    assert bytes(_boost(params, dtrain, 30).save_raw("ubj")) == bytes(expected.save_raw("ubj"))
