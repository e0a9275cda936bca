from __future__ import annotations

import numpy as np
import pytest
import xgboost as xgb

from slorouter.predictor.baseline import BaselineError, LinearBaseline
from slorouter.predictor.features import DEFAULT_SCHEMA
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.predictor import Predictor
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer, TrainerConfig
from tests.helpers.predictor_models import synthetic

NAMES = DEFAULT_SCHEMA.features("ttft")


def test_fit_recovers_a_non_negative_linear_law_and_skips_the_prefix_score() -> None:
    x, _, _, _ = synthetic(3000, seed=1)
    waiting, prefill = NAMES.index("num_request_waiting"), NAMES.index("prefill_tokens_in_flight")
    y = 5.0 + 30.0 * x[:, waiting] + 0.002 * x[:, prefill]
    baseline = LinearBaseline.fit(x, y, NAMES)
    coef = dict(zip(baseline.names, baseline.coef, strict=True))
    assert "prefix_cache_score" not in coef
    assert baseline.intercept == pytest.approx(5.0, rel=1e-3)
    assert coef["num_request_waiting"] == pytest.approx(30.0, rel=1e-3)
    assert coef["prefill_tokens_in_flight"] == pytest.approx(0.002, rel=1e-3)
    assert all(c >= 0 for c in baseline.coef)
    np.testing.assert_allclose(np.exp(baseline.log_ms(x)), y, rtol=1e-3)


def test_round_trip_and_validation() -> None:
    x, y, _, _ = synthetic(500)
    baseline = LinearBaseline.fit(x, y, NAMES).with_base_score(1.5)
    assert LinearBaseline.from_dict(baseline.to_dict(), NAMES) == baseline
    moved = {**baseline.to_dict(), "columns": [c + 1 for c in baseline.columns]}
    with pytest.raises(BaselineError, match="is not column"):
        LinearBaseline.from_dict(moved, NAMES)
    with pytest.raises(BaselineError, match="finite"):
        LinearBaseline.from_dict({**baseline.to_dict(), "floor_ms": 0.0}, NAMES)
    with pytest.raises(BaselineError, match="invalid"):
        LinearBaseline.from_dict({"names": []}, NAMES)


def test_predictions_extrapolate_beyond_the_training_range(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Trained on queues of 0-19, asked about queues of 40-60: trees alone stay flat, the baseline follows."""
    x, y, _, _ = synthetic(4000, seed=2)
    fresh, fresh_y, _, _ = synthetic(500, seed=3)
    waiting = NAMES.index("num_request_waiting")
    fresh[:, waiting] += 40
    fresh_y = fresh_y + 30 * 40  # the synthetic law adds 30 ms per queued request (noise aside)

    def fresh_mape(baseline: bool) -> float:
        trainer = Trainer(
            SampleStore(), ModelStore(tmp_path / str(baseline)), TrainerConfig(nthread=1, baseline=baseline)
        )
        trainer.store.add("ttft", x, y)
        assert trainer.train("ttft") is not None
        predictor = Predictor(ModelStore(tmp_path / str(baseline)))
        predictor.refresh()
        p90, _ = predictor.predict(fresh, np.zeros((len(fresh), 7), dtype=np.float32))
        point = p90 * predictor.point_factor("ttft")
        return float(np.mean(np.abs(point - fresh_y) / fresh_y))

    assert fresh_mape(True) < 0.15 < 0.3 < fresh_mape(False)


def test_compiled_forest_and_xgboost_agree_with_a_baseline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    x, y, _, _ = synthetic(3000, seed=4)
    trainer = Trainer(SampleStore(), ModelStore(tmp_path), TrainerConfig(n_estimators=40, nthread=1))
    trainer.store.add("ttft", x, y)
    trainer.train("ttft")
    compiled, plain = Predictor(ModelStore(tmp_path)), Predictor(ModelStore(tmp_path), compile_forest=False)
    compiled.refresh()
    plain.refresh()
    probe, _, probe_t, _ = synthetic(200, seed=5)
    np.testing.assert_allclose(
        compiled.predict(probe, probe_t)[0], plain.predict(probe, probe_t)[0], rtol=1e-4
    )
    current = trainer._state["ttft"].current
    assert current is not None and current.baseline is not None
    with_margin = current.booster.predict(xgb.DMatrix(probe, base_margin=current.baseline.log_ms(probe)))
    np.testing.assert_allclose(
        plain.predict(probe, probe_t)[0], np.exp(with_margin + current.metadata.offset), rtol=1e-4
    )
