"""The compiled forest against XGBoost's own predictions: edge values, shapes, reuse and threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import xgboost as xgb

from slorouter.predictor.forest import _CACHE_BYTES, CompiledForest
from slorouter.predictor.forest_compiler import pack_trees
from tests.helpers.predictor_models import synthetic


def _booster(X: np.ndarray, y: np.ndarray, rounds: int = 40, **params: object) -> xgb.Booster:
    base = {"objective": "reg:squarederror", "max_depth": 6, "eta": 0.1, "nthread": 1, "seed": 0}
    return xgb.train({**base, **params}, xgb.DMatrix(X, label=y), rounds)


@pytest.fixture(scope="module")
def model() -> tuple[xgb.Booster, CompiledForest]:
    x, y, _, _ = synthetic(4000, seed=11)
    booster = _booster(x, np.log(y))
    forest = CompiledForest.from_booster(booster, x.shape[1])
    assert forest is not None
    return booster, forest


def _expected(booster: xgb.Booster, X: np.ndarray) -> np.ndarray:
    return booster.inplace_predict(X, validate_features=False).astype(np.float64)


def _close(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_matches_xgboost_on_exact_thresholds_and_their_neighbours(
    model: tuple[xgb.Booster, CompiledForest],
) -> None:
    booster, forest = model
    cuts = [t for t in forest._thresholds if len(t)]
    rng = np.random.default_rng(0)
    base, _, _, _ = synthetic(300, seed=12)
    rows = []
    for _ in range(300):
        row = base[rng.integers(0, len(base))].copy()
        for f, values in enumerate(forest._thresholds):
            if len(values) and rng.random() < 0.7:
                value = values[rng.integers(0, len(values))]
                row[f] = rng.choice(
                    [value, np.nextafter(value, np.float32(-1)), np.nextafter(value, np.float32(2e9))]
                )
        rows.append(row)
    X = np.abs(np.array(rows, dtype=np.float32))
    assert cuts
    _close(forest.predict(X), _expected(booster, X))


def test_negative_values_zero_signs_and_extremes(model: tuple[xgb.Booster, CompiledForest]) -> None:
    booster, forest = model
    big = np.finfo(np.float32).max
    values = np.array([-big, -1e9, -1.5, -0.0, 0.0, 1e-30, 0.5, 1.0, 1e9, big], dtype=np.float32)
    rng = np.random.default_rng(1)
    X = values[rng.integers(0, len(values), (500, forest.n_features))]
    _close(forest.predict(X), _expected(booster, X))


@pytest.mark.parametrize("n", [1, 2, 100, 101, 1000, 2500])
def test_any_row_count_and_buffer_reuse(model: tuple[xgb.Booster, CompiledForest], n: int) -> None:
    booster, forest = model
    x, _, _, _ = synthetic(n, seed=n)
    first = forest.predict(x)
    _close(first, _expected(booster, x))
    second = forest.predict(x)
    assert second is not first and np.array_equal(first, second)  # results never alias the work arrays
    assert forest.predict(x[:0]).shape == (0,)


def test_work_arrays_of_many_batch_sizes_stay_within_the_budget(
    model: tuple[xgb.Booster, CompiledForest],
) -> None:
    booster, forest = model
    x, _, _, _ = synthetic(1024, seed=15)
    for n in [*range(90, 130), 1024, 700, 1024]:
        _close(forest.predict(x[:n]), _expected(booster, x[:n]))
    assert sum(b.nbytes for b in forest._buffers.values()) <= _CACHE_BYTES
    assert 1024 in forest._buffers  # the most recent size is kept


def test_non_contiguous_and_float64_input(model: tuple[xgb.Booster, CompiledForest]) -> None:
    booster, forest = model
    x, _, _, _ = synthetic(200, seed=5)
    wide = np.repeat(x, 2, axis=1)[:, ::2]  # a strided view of the same values
    _close(forest.predict(wide), _expected(booster, x))
    _close(forest.predict(x.astype(np.float64)), _expected(booster, x))


def test_threads_predicting_at_once_get_their_own_answers(model: tuple[xgb.Booster, CompiledForest]) -> None:
    booster, forest = model
    inputs = [synthetic(50 + 17 * i, seed=20 + i)[0] for i in range(4)]
    expected = [_expected(booster, X) for X in inputs]
    errors: list[str] = []

    def work(i: int) -> None:
        for _ in range(50):
            got = forest.predict(inputs[i])
            if not np.allclose(got, expected[i], rtol=1e-5, atol=1e-5):
                errors.append(f"thread {i}")
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


def test_unused_features_and_stumps() -> None:
    x, y, _, _ = synthetic(2000, seed=7)
    x[:, 2] = 3.0  # a constant column: no tree splits on it
    booster = _booster(x, np.log(y))
    forest = CompiledForest.from_booster(booster, x.shape[1])
    assert forest is not None and len(forest._thresholds[2]) == 0
    probe, _, _, _ = synthetic(300, seed=8)
    _close(forest.predict(probe), _expected(booster, probe))
    # Trees that are a single leaf (constant target): nothing to split on at all.
    stumps = _booster(x, np.full(len(x), 2.5), rounds=3)
    forest = CompiledForest.from_booster(stumps, x.shape[1])
    assert forest is not None
    _close(forest.predict(probe), _expected(stumps, probe))


def test_quantile_objective_and_models_it_does_not_cover() -> None:
    x, y, _, _ = synthetic(3000, seed=9)
    booster = _booster(x, np.log(y), objective="reg:quantileerror", quantile_alpha=0.9)
    forest = CompiledForest.from_booster(booster, x.shape[1])
    assert forest is not None
    probe, _, _, _ = synthetic(400, seed=10)
    _close(forest.predict(probe), _expected(booster, probe))
    assert CompiledForest.from_booster(_booster(x, y, rounds=3, max_depth=8), x.shape[1]) is None


def test_small_trees_share_words_and_full_trees_fill_one() -> None:
    x, y, _, _ = synthetic(4000, seed=13)
    probe, _, _, _ = synthetic(500, seed=14)
    shallow = _booster(x, np.log(y), rounds=61, max_depth=3)  # ≤ 8 leaves: two trees per word
    forest = CompiledForest.from_booster(shallow, x.shape[1])
    assert forest is not None and forest.n_trees == 61 and forest.n_words == 31 and forest.n_layers == 2
    _close(forest.predict(probe), _expected(shallow, probe))
    noise = np.random.default_rng(0).random(len(x))  # unlearnable: trees grow every branch
    dense = _booster(x, noise, rounds=20, max_depth=6, min_child_weight=0, eta=0.3)
    forest = CompiledForest.from_booster(dense, x.shape[1])
    assert forest is not None and forest.n_words >= 10
    _close(forest.predict(probe), _expected(dense, probe))


def test_combined_forest_predicts_every_part_in_one_pass() -> None:
    x, y, xt, yt = synthetic(3000, seed=21)
    ttft = _booster(x, np.log(y))
    tpot = _booster(xt, np.log(yt), rounds=30, max_depth=4)  # other tree sizes: words of one and two trees
    parts = [CompiledForest.from_booster(ttft, 8), CompiledForest.from_booster(tpot, 7)]
    assert parts[0] is not None and parts[1] is not None
    # The union of both models' columns: TTFT's eight, then TPOT's last one (the first six are shared).
    columns = [list(range(8)), [0, 1, 2, 3, 4, 5, 8]]
    combined = CompiledForest.combine(parts, columns, 9)  # type: ignore[arg-type]
    assert combined.n_outputs == 2 and combined.n_trees == 70
    for n in (1, 100, 1500):  # 1,500: chunked
        px, _, pt, _ = synthetic(n, seed=22)
        union = np.concatenate([px, pt[:, 6:]], axis=1)
        got = combined.predict_outputs(union)
        assert got.shape == (2, n) and got.flags.c_contiguous
        _close(got[0], _expected(ttft, px))
        _close(got[1], _expected(tpot, pt))
        np.testing.assert_allclose(got[0], parts[0].predict(px), rtol=1e-12)
    assert combined.predict_outputs(union[:0]).shape == (2, 0)
    with pytest.raises(ValueError, match="predict_outputs"):
        combined.predict(union)
    with pytest.raises(ValueError, match="reads a column twice"):
        CompiledForest.combine(parts, [list(range(8)), [0, 1, 2, 3, 4, 5, 5]], 9)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not fit"):
        CompiledForest.combine(parts, [list(range(8)), [0, 1, 2, 3, 4, 5, 9]], 9)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="single-output"):
        CompiledForest.combine([combined], [list(range(9))], 9)


def test_compiling_is_not_fooled_by_node_numbering() -> None:
    """The compiler walks the node arrays by their child links (not by position): a model whose nodes are
    renumbered (the root stays node 0, XGBoost's convention; children before parents) compiles to the same
    predictions."""
    x, y, _, _ = synthetic(2000, seed=23)
    booster = _booster(x, np.log(y), rounds=5)
    model = __import__("orjson").loads(booster.save_raw("json"))
    reference = pack_trees(model, 8)
    for tree in model["learner"]["gradient_booster"]["model"]["trees"]:
        size = len(tree["left_children"])
        order = [0, *range(size - 1, 0, -1)]  # new position of each old node
        for key in ("split_indices", "split_conditions", "split_type", "default_left"):
            values = tree[key]
            tree[key] = [values[order.index(i)] for i in range(size)]
        for key in ("left_children", "right_children"):
            values = tree[key]
            tree[key] = [
                -1 if values[order.index(i)] == -1 else order[values[order.index(i)]] for i in range(size)
            ]
    renumbered = pack_trees(model, 8)
    assert reference is not None and renumbered is not None
    probe, _, _, _ = synthetic(200, seed=24)
    first = CompiledForest([reference], [range(8)], 8).predict(probe)
    second = CompiledForest([renumbered], [range(8)], 8).predict(probe)
    np.testing.assert_array_equal(first, second)
    _close(first, _expected(booster, probe))
