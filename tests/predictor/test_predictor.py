from __future__ import annotations

import threading

import numpy as np
import pytest
import xgboost as xgb

from slorouter.predictor.features import (
    SCHEMA_VERSION,
    FeatureError,
    FeatureSchema,
    SchemaMismatchError,
    rows_to_matrices,
)
from slorouter.predictor.forest import CompiledForest
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.predictor import Predictor
from slorouter.predictor.trainer import Trainer, booster_predict_ms
from tests.helpers.predictor_models import synthetic


@pytest.fixture
def trained(trainer: Trainer) -> Trainer:
    x, y, xt, yt = synthetic(3000)
    trainer.store.add("ttft", x, y)
    trainer.store.add("tpot", xt, yt)
    assert trainer.train("ttft") is not None
    return trainer


def test_compiled_forest_matches_xgboost() -> None:
    x, y, xt, yt = synthetic(5000, seed=3)
    for X, target, objective in ((x, np.log(y), "reg:quantileerror"), (xt, yt, "reg:squarederror")):
        params = {"objective": objective, "max_depth": 6, "eta": 0.1, "nthread": 1}
        if objective == "reg:quantileerror":
            params["quantile_alpha"] = 0.9
        booster = xgb.train(params, xgb.DMatrix(X, label=target), 50)
        forest = CompiledForest.from_booster(booster, X.shape[1])
        assert forest is not None
        probe, _, probe_t, _ = synthetic(1000, seed=4)
        probe = probe if X.shape[1] == 8 else probe_t
        np.testing.assert_allclose(
            forest.predict(probe), booster.inplace_predict(probe), rtol=1e-5, atol=1e-4
        )
    deep = xgb.train({"max_depth": 8, "nthread": 1}, xgb.DMatrix(x, label=y), 5)
    assert CompiledForest.from_booster(deep, 8) is None  # > 64 leaves: the predictor falls back to XGBoost


def test_ttft_only_model_makes_predictor_ready_with_nan_tpot(trained: Trainer) -> None:
    predictor = Predictor(trained.model_store)
    assert predictor.refresh() and predictor.ready
    assert predictor.versions == {"ttft": trained.current_version("ttft"), "tpot": None}
    x, _, xt, _ = synthetic(50, seed=9)
    ttft, tpot = predictor.predict(x, xt)
    assert ttft.shape == (50,) and np.all(ttft > 0) and np.all(np.isnan(tpot))
    current = trained._state["ttft"].current
    assert current is not None and current.metadata.offset > 0  # a conformal p90 sits above the point
    assert current.baseline is not None  # a linear load baseline under the trees, by default
    expected = booster_predict_ms(current.booster, x, "log", current.metadata.offset, current.baseline)
    np.testing.assert_allclose(ttft, expected, rtol=1e-4)
    empty_ttft, empty_tpot = predictor.predict(x[:0], xt[:0])
    assert empty_ttft.shape == empty_tpot.shape == (0,)


def test_reload_only_when_the_version_changes(trained: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    predictor = Predictor(trained.model_store)
    assert predictor.refresh()
    loads = []
    original = predictor._prepare
    monkeypatch.setattr(predictor, "_prepare", lambda *a: (loads.append(a[0]), original(*a))[1])
    for _ in range(5):
        assert not predictor.refresh()
    assert loads == []
    assert trained.train("tpot") is not None
    assert predictor.refresh() and loads == ["tpot"]
    trained.store.add("ttft", *synthetic(10, seed=5)[:2])
    assert trained.train("ttft").accepted  # type: ignore[union-attr]
    assert predictor.refresh() and loads == ["tpot", "ttft"]
    assert predictor.versions["ttft"] == trained.current_version("ttft")
    assert not predictor.refresh()


def test_model_of_another_schema_is_refused(trained: Trainer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    predictor = Predictor(trained.model_store, expected_schema=FeatureSchema(pod_class=True))
    assert not predictor.refresh() and not predictor.ready
    assert "trained on feature schema" in predictor.errors["ttft"]
    raw, metadata = trained.model_store.load("ttft")  # type: ignore[misc]
    with pytest.raises(SchemaMismatchError):
        predictor.load_raw("ttft", raw, metadata)
    with pytest.raises(SchemaMismatchError):
        Predictor(expected_schema=SCHEMA_VERSION + 1).load_raw("ttft", raw, metadata)
    ok = Predictor()  # no model store: models come as bytes (e.g. an HTTP download)
    ok.load_raw("ttft", raw, metadata)
    assert ok.ready and not ok.refresh()
    with pytest.raises(ValueError, match="metadata is for a ttft model"):
        ok.load_raw("tpot", raw, metadata)


def test_predict_rows_validates(trained: Trainer) -> None:
    predictor = Predictor(trained.model_store)
    predictor.refresh()
    row = {
        "kv_cache_percentage": 0.2,
        "input_token_length": 500,
        "num_request_waiting": 0,
        "num_request_running": 4,
        "prefill_tokens_in_flight": 0,
        "decode_tokens_in_flight": 1000,
        "prefix_cache_score": 0.5,
        "num_tokens_generated": 100,
    }
    ttft, _ = predictor.predict_rows([row, row])
    x_ttft, x_tpot = rows_to_matrices([row, row])
    np.testing.assert_array_equal(ttft, predictor.predict(x_ttft, x_tpot)[0])
    with pytest.raises(FeatureError, match=r"rows\[1\]\.kv_cache_percentage"):
        predictor.predict_rows([row, {**row, "kv_cache_percentage": 2}])
    with pytest.raises(ValueError, match="8 features"):
        predictor.predict(x_tpot, x_tpot)


def test_reload_does_not_disturb_concurrent_predictions(trained: Trainer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    predictor = Predictor(trained.model_store)
    predictor.refresh()
    x, _, xt, _ = synthetic(100, seed=11)
    raw_a, meta_a = trained.model_store.load("ttft")  # type: ignore[misc]
    trained.store.add("ttft", *synthetic(500, seed=12)[:2])
    trained.train("ttft")
    raw_b, meta_b = trained.model_store.load("ttft")  # type: ignore[misc]
    expected = []
    for raw, meta in ((raw_a, meta_a), (raw_b, meta_b)):
        p = Predictor()
        p.load_raw("ttft", raw, meta)
        expected.append(p.predict(x, xt)[0])
    stop = threading.Event()
    errors: list[str] = []

    def predict_loop() -> None:
        while not stop.is_set():
            got = predictor.predict(x, xt)[0]
            if not any(np.array_equal(got, e) for e in expected):
                errors.append("a prediction mixed two models")

    threads = [threading.Thread(target=predict_loop) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(30):
        raw, meta = (raw_a, meta_a) if i % 2 else (raw_b, meta_b)
        predictor.load_raw("ttft", raw, meta)
    stop.set()
    for t in threads:
        t.join()
    assert not errors


def test_store_directory_shared_with_a_separate_predictor_process_layout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert Predictor(ModelStore(tmp_path)).refresh() is False


def test_both_models_in_one_pass_equal_each_model_alone(trained: Trainer) -> None:
    assert trained.train("tpot") is not None
    predictor = Predictor(trained.model_store)
    predictor.refresh()
    assert predictor.status()["evaluator"] == "compiled, both models in one pass"
    x, _, xt, _ = synthetic(120, seed=31)
    ttft, tpot = predictor.predict(x, xt)
    models = predictor._models
    np.testing.assert_allclose(ttft, models["ttft"].predict(x), rtol=1e-6)
    np.testing.assert_allclose(tpot, models["tpot"].predict(xt), rtol=1e-6)
    for kind, got, X in (("ttft", ttft, x), ("tpot", tpot, xt)):
        model = models[kind]
        expected = booster_predict_ms(model.booster, X, "log", model.offset, model.baseline)
        np.testing.assert_allclose(got, expected, rtol=1e-4)
    # Rows of the union of the features (the servers' validated rows) give the same predictions.
    union = np.concatenate([x, xt[:, 6:]], axis=1)
    all_ttft, all_tpot = predictor.predict_all(union)
    np.testing.assert_array_equal(all_ttft, ttft)
    np.testing.assert_array_equal(all_tpot, tpot)
    np.testing.assert_array_equal(predictor.predict_all(union.astype(np.float64)[:, :])[0], ttft)
    with pytest.raises(ValueError, match="9 features"):
        predictor.predict_all(x)
    # Matrices whose shared features differ: each model reads its own (the per-model path).
    other = xt.copy()
    other[:, 0] = np.clip(other[:, 0] + 0.3, 0, 1)
    ttft_other, tpot_other = predictor.predict(x, other)
    np.testing.assert_array_equal(ttft_other, models["ttft"].predict(x))
    np.testing.assert_array_equal(tpot_other, models["tpot"].predict(other))
    empty = predictor.predict(x[:0], xt[:0])
    assert empty[0].shape == empty[1].shape == (0,)


def test_without_a_tpot_model_predict_all_gives_nan_tpot(trained: Trainer) -> None:
    predictor = Predictor(trained.model_store)
    predictor.refresh()
    assert predictor.status()["evaluator"] == "per model"
    x, _, xt, _ = synthetic(10, seed=32)
    ttft, tpot = predictor.predict_all(np.concatenate([x, xt[:, 6:]], axis=1))
    np.testing.assert_array_equal(ttft, predictor.predict(x, xt)[0])
    assert np.isnan(tpot).all()


@pytest.mark.parametrize(
    ("objective", "pod_class"), [("mean", False), ("conformal", True), ("quantile", False)]
)
def test_one_pass_for_every_objective_and_schema(tmp_path, objective: str, pod_class: bool) -> None:  # type: ignore[no-untyped-def]
    from slorouter.clock import ManualClock
    from slorouter.predictor.store import SampleStore
    from slorouter.predictor.trainer import TrainerConfig

    schema = FeatureSchema(pod_class=pod_class)
    config = TrainerConfig(objective=objective, n_estimators=15, nthread=1)  # type: ignore[arg-type]
    trainer = Trainer(SampleStore(schema=schema), ModelStore(tmp_path), config, ManualClock(0.0))
    x, y, xt, yt = synthetic(1500, seed=33)
    if pod_class:  # the pod class is the last column of both models; the union's columns are not a prefix
        codes = np.random.default_rng(0).integers(0, 3, len(x)).astype(np.float32)
        x, xt = np.column_stack([x, codes]), np.column_stack([xt, codes])
        y = y * (1 + codes)
    trainer.store.add("ttft", x, y)
    trainer.store.add("tpot", xt, yt)
    assert trainer.train("ttft") is not None and trainer.train("tpot") is not None
    predictor = Predictor(trainer.model_store, expected_schema=schema)
    predictor.refresh()
    assert predictor._state.joint is not None
    ttft, tpot = predictor.predict(x[:200], xt[:200])
    models = predictor._models
    np.testing.assert_allclose(ttft, models["ttft"].predict(x[:200]), rtol=1e-6)
    np.testing.assert_allclose(tpot, models["tpot"].predict(xt[:200]), rtol=1e-6)
    assert (ttft >= 0).all() and (tpot >= 0).all()
    union = schema.all_features()
    X = np.empty((200, len(union)), dtype=np.float32)
    X[:, [union.index(f) for f in schema.features("ttft")]] = x[:200]
    X[:, [union.index(f) for f in schema.features("tpot")]] = xt[:200]
    np.testing.assert_array_equal(predictor.predict_all(X)[1], tpot)


def test_refresh_of_both_kinds_combines_them_once(trained: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert trained.train("tpot") is not None
    predictor = Predictor(trained.model_store)
    combined = []
    original = predictor._joint_of
    monkeypatch.setattr(
        predictor, "_joint_of", lambda models: (combined.append(set(models)), original(models))[1]
    )
    assert predictor.refresh()
    assert combined == [{"ttft", "tpot"}] and predictor._state.joint is not None
