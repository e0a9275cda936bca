"""A linear load baseline under the trees, so predictions extrapolate to loads never seen in training.

Regression trees predict a constant beyond the range of their training data: when a pod's queue grows
deeper than any queue in the sample window (the first overload of a run, a traffic spike), a tree model
keeps predicting the worst latency it has seen and under-predicts, exactly when routing matters most. A
pod's latency is, to first order, linear in the work ahead of the request (tokens to prefill, requests
queued, tokens being decoded), so the trainer first fits

    baseline_ms = c₀ + Σⱼ cⱼ·xⱼ,   cⱼ ≥ 0   (non-negative least squares on relative errors)

over the kind's load features, then trains the trees on log(latency) with log(baseline) as each row's base
margin: the trees learn the (bounded) log ratio to the baseline, and beyond the data the baseline carries
the trend. On simulator traffic that overloads a pool for the first time, this cut the TTFT MAPE of the
next window from 0.47 to 0.23 (docs/predictor.md).

The booster's own ``base_score`` is replaced by the baseline, so a prediction's margin is
``trees(x) − base_score + log(baseline(x))`` whatever evaluates the trees (XGBoost or the compiled forest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import nnls

# Features that do not add latency as they grow (a higher prefix score means less work; the pod class is a
# category): never in the baseline.
EXCLUDED_FEATURES = frozenset({"prefix_cache_score", "pod_class"})
MAX_FIT_ROWS = 20_000


class BaselineError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class LinearBaseline:
    names: tuple[str, ...]  # the features it reads, by name
    columns: tuple[int, ...]  # and their columns in the kind's feature matrix
    intercept: float
    coef: tuple[float, ...]
    floor_ms: float  # predictions are at least this (keeps the log finite)
    base_score: float  # the booster's base score, which the baseline replaces
    _dense: np.ndarray = field(init=False, repr=False, compare=False)  # coefficients over every column

    def __post_init__(self) -> None:
        width = max(self.columns, default=-1) + 1
        dense = np.zeros(width, dtype=np.float32)
        dense[list(self.columns)] = self.coef
        object.__setattr__(self, "_dense", dense)

    @classmethod
    def fit(
        cls, X: np.ndarray, y_ms: np.ndarray, feature_names: Sequence[str], seed: int = 0
    ) -> LinearBaseline:
        """Fit on training rows (``X`` in the kind's column order, latencies in ms); base_score set later."""
        columns = tuple(j for j, name in enumerate(feature_names) if name not in EXCLUDED_FEATURES)
        y = np.asarray(y_ms, dtype=np.float64)
        rows = np.arange(len(y))
        if len(rows) > MAX_FIT_ROWS:
            rows = np.random.default_rng(seed).choice(rows, MAX_FIT_ROWS, replace=False)
        picked = np.asarray(X, dtype=np.float64)[np.ix_(rows, np.array(columns, dtype=np.intp))]
        A = np.column_stack([np.ones(len(rows)), picked])
        weights = 1.0 / y[rows]
        scale = np.maximum(np.abs(A).max(axis=0), 1e-12)  # conditioning: NNLS on unit-range columns
        solution, _ = nnls(A / scale * weights[:, None], y[rows] * weights, maxiter=50 * A.shape[1])
        solution = solution / scale
        floor = max(float(np.min(y)) * 0.5, 1e-3)
        return cls(
            names=tuple(feature_names[j] for j in columns),
            columns=columns,
            intercept=float(solution[0]),
            coef=tuple(float(c) for c in solution[1:]),
            floor_ms=floor,
            base_score=0.0,
        )

    def with_base_score(self, base_score: float) -> LinearBaseline:
        return LinearBaseline(self.names, self.columns, self.intercept, self.coef, self.floor_ms, base_score)

    def log_ms(self, X: np.ndarray) -> np.ndarray:
        """log(baseline) per row of ``X`` (the kind's feature matrix), float64."""
        dense = self._dense
        if X.dtype != np.float32:
            X = X.astype(np.float32)
        linear = X[:, : len(dense)] @ dense  # float32 on the hot path: ~2x faster, error ~1e-7 relative
        linear += np.float32(self.intercept)
        np.maximum(linear, np.float32(self.floor_ms), out=linear)
        return np.log(linear).astype(np.float64)

    def margin_shift(self, X: np.ndarray) -> np.ndarray:
        """What to add to the trees' margin (base score included) to get the model's margin."""
        return self.log_ms(X) - self.base_score

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "columns": list(self.columns),
            "intercept": self.intercept,
            "coef": list(self.coef),
            "floor_ms": self.floor_ms,
            "base_score": self.base_score,
        }

    @classmethod
    def from_dict(cls, data: Any, feature_names: Sequence[str]) -> LinearBaseline:
        """Validate stored baseline metadata against the model's feature names."""
        try:
            names = tuple(str(n) for n in data["names"])
            columns = tuple(int(c) for c in data["columns"])
            coef = tuple(float(c) for c in data["coef"])
            values = (float(data["intercept"]), float(data["floor_ms"]), float(data["base_score"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BaselineError(f"invalid baseline metadata: {exc!r}") from None
        if not (len(names) == len(columns) == len(coef)):
            raise BaselineError("baseline metadata: names, columns and coef differ in length")
        for name, column in zip(names, columns, strict=True):
            if not 0 <= column < len(feature_names) or feature_names[column] != name:
                raise BaselineError(
                    f"baseline metadata: feature {name!r} is not column {column} of the model"
                )
        if not all(math.isfinite(v) for v in (*coef, *values)) or values[1] <= 0:
            raise BaselineError("baseline metadata: coefficients must be finite and floor_ms > 0")
        return cls(names, columns, values[0], coef, values[1], values[2])
