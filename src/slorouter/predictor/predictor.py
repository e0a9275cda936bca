"""Predicting TTFT and TPOT for a whole candidate set in one call, from the newest trained models.

The same object serves in-process (embedded mode) and behind the prediction server. It loads models from
a ``ModelStore`` (``refresh``, cheap when nothing changed: one small file read per kind) or from bytes
downloaded elsewhere (``load_raw``), refuses models trained on another feature schema (or, when it is told
its ``pool_shape``, on a pool this one does not fit), and swaps models
atomically: a predict running during a reload finishes with the model it started with.

Readiness: ``ready`` is True once a TTFT model is loaded. Before that ``predict`` raises
``PredictorNotReady`` (the router then falls back to its heuristics). TPOT samples need a finished
request, so the TPOT model usually arrives later: until it does, TPOT predictions are NaN.

Speed: each booster is compiled into a ``CompiledForest`` (vectorised numpy, several times faster than
``inplace_predict`` for 100 rows, see forest.py) when the model allows; otherwise ``inplace_predict`` on
float32 C-contiguous rows with ``nthread=1`` (more threads only add tail latency next to a busy router).
Once both models are compiled they are also combined into one forest over the union of their features
(``_Joint``): one pass places the shared columns once, and one matrix product applies both linear
baselines, so a candidate set costs less than two separate predictions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xgboost as xgb

from slorouter.predictor.baseline import LinearBaseline
from slorouter.predictor.features import (
    DEFAULT_SCHEMA,
    MODEL_KINDS,
    SCHEMA_VERSION,
    FeatureSchema,
    ModelKind,
    SchemaMismatchError,
    check_kind,
    rows_to_matrices,
)
from slorouter.predictor.forest import CompiledForest
from slorouter.predictor.model_store import ModelFileError, ModelMetadata, ModelStore
from slorouter.predictor.pool_shape import PoolShape, PoolShapeMismatchError

log = logging.getLogger(__name__)


class PredictorNotReady(RuntimeError):
    """No TTFT model has been trained yet."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    kind: ModelKind
    metadata: ModelMetadata
    booster: xgb.Booster
    forest: CompiledForest | None
    n_features: int
    log_target: bool
    offset: float  # added to the margin: the conformal offset of a ``conformal`` model, else 0
    baseline: LinearBaseline | None = None  # the linear load baseline under the trees, if trained with one

    @property
    def point_factor(self) -> float:
        """Multiply a prediction by this to get the point (median-like) prediction it was derived from."""
        return float(np.exp(-self.offset)) if self.log_target else 1.0

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Latency in ms (float64, ≥ 0) for the rows of ``X``."""
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"{self.kind} rows must have {self.n_features} features, got shape {X.shape}")
        if X.dtype != np.float32 or not X.flags.c_contiguous:
            X = np.ascontiguousarray(X, dtype=np.float32)
        if self.forest is not None:
            raw = self.forest.predict(X)
        else:
            raw = self.booster.inplace_predict(X, validate_features=False).astype(np.float64)
        if self.baseline is not None:
            raw += self.baseline.margin_shift(X)
        if self.offset:
            raw += self.offset
        if self.log_target:
            return np.exp(raw, out=raw)
        return np.maximum(raw, 0.0, out=raw)


class _Joint:
    """Both compiled models in one pass over the union of their features (``schema.all_features()``):
    the combined forest's margins, plus both linear baselines as one product, plus each model's offset, then
    exp (log-target models) or max(·, 0). Equal to the two models' own ``predict`` up to float rounding."""

    __slots__ = ("coef", "floor", "forest", "intercept", "log_rows", "shift", "tpot_columns", "ttft_columns")

    def __init__(self, ttft: LoadedModel, tpot: LoadedModel, schema: FeatureSchema) -> None:
        assert ttft.forest is not None and tpot.forest is not None
        union = schema.all_features()
        models = (ttft, tpot)
        columns = [[union.index(name) for name in schema.features(m.kind)] for m in models]
        self.ttft_columns = schema.union_columns("ttft")
        self.tpot_columns = schema.union_columns("tpot")
        self.forest = CompiledForest.combine([ttft.forest, tpot.forest], columns, len(union))
        # Baselines over the union's columns; a model without one gets 0·x + 1, whose log is 0.
        coef = np.zeros((2, len(union)), dtype=np.float32)
        intercept = np.ones((2, 1), dtype=np.float32)
        floor = np.ones((2, 1), dtype=np.float32)
        shift = np.zeros((2, 1), dtype=np.float64)
        for m, (model, cols) in enumerate(zip(models, columns, strict=True)):
            shift[m] = model.offset
            if model.baseline is not None:
                b = model.baseline
                coef[m, [cols[j] for j in b.columns]] = b.coef
                intercept[m], floor[m] = b.intercept, b.floor_ms
                shift[m] -= b.base_score
        self.coef, self.intercept, self.floor, self.shift = coef, intercept, floor, shift
        self.log_rows = (ttft.log_target, tpot.log_target)

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Latencies in ms (TTFT, TPOT) for union rows ``X`` (float32, C-contiguous)."""
        out = self.forest.predict_outputs(X)
        linear = np.matmul(self.coef, X.T)
        linear += self.intercept
        np.maximum(linear, self.floor, out=linear)
        out += np.log(linear, out=linear)
        out += self.shift
        if self.log_rows == (True, True):
            np.exp(out, out=out)
        else:
            for m, log_target in enumerate(self.log_rows):
                if log_target:
                    np.exp(out[m], out=out[m])
                else:
                    np.maximum(out[m], 0.0, out=out[m])
        return out[0], out[1]

    def union_of(self, x_ttft: np.ndarray, x_tpot: np.ndarray) -> np.ndarray | None:
        """The union rows of a TTFT and a TPOT matrix, or None unless the shared features agree (and the
        shapes fit): then each model must read its own matrix."""
        n = x_ttft.shape[0]
        if x_ttft.ndim != 2 or x_tpot.shape[0] != n or n == 0:
            return None
        X = np.empty((n, self.forest.n_features), dtype=np.float32)
        try:
            X[:, self.tpot_columns] = x_tpot
            X[:, self.ttft_columns] = x_ttft
        except ValueError:  # a shape that does not fit: the per-model path says which
            return None
        if not np.array_equal(X[:, self.tpot_columns], x_tpot):
            return None
        return X


@dataclass(frozen=True, slots=True)
class _State:
    models: dict[str, LoadedModel]
    joint: _Joint | None = None


class Predictor:
    """Holds the current TTFT and TPOT models and predicts with them."""

    def __init__(
        self,
        model_store: ModelStore | None = None,
        *,
        expected_schema: FeatureSchema | int = SCHEMA_VERSION,
        compile_forest: bool = True,
    ) -> None:
        if isinstance(expected_schema, FeatureSchema):
            self.schema = expected_schema
        elif expected_schema == SCHEMA_VERSION:
            self.schema = DEFAULT_SCHEMA
        else:
            self.schema = FeatureSchema(version=int(expected_schema))
        self.model_store = model_store
        self.compile_forest = compile_forest
        self._state = _State({})  # replaced whole, never mutated: readers need no lock
        self._load_lock = threading.Lock()
        self._refused: dict[str, str] = {}  # kind -> version refused (not retried until the version moves)
        self.errors: dict[str, str] = {}  # kind -> last load error
        self.pool_shape: PoolShape | None = (
            None  # when set, models learnt on a pool it does not fit are refused
        )

    @property
    def _models(self) -> dict[str, LoadedModel]:
        return self._state.models

    # ------------------------------------------------------------------------------------- loading

    @property
    def ready(self) -> bool:
        return "ttft" in self._models

    @property
    def versions(self) -> dict[str, str | None]:
        models = self._models
        return {kind: (m.metadata.version if (m := models.get(kind)) else None) for kind in MODEL_KINDS}

    def metadata(self, kind: ModelKind) -> ModelMetadata | None:
        model = self._models.get(check_kind(kind))
        return None if model is None else model.metadata

    def refresh(self) -> bool:
        """Load any kind whose version in the model store changed; True if a model was (re)loaded.

        A model that cannot be used (other schema, corrupt) is refused once, recorded in ``errors`` and
        logged, and not retried until the store's version changes; the previous model keeps serving.
        """
        if self.model_store is None:
            return False
        prepared = []
        for kind in MODEL_KINDS:
            version = self.model_store.latest_version(kind)
            current = self._models.get(kind)
            if version is None or (current is not None and current.metadata.version == version):
                continue
            if self._refused.get(kind) == version:
                continue
            try:
                loaded = self.model_store.load(kind)
                if loaded is None:
                    continue
                raw, metadata = loaded
                prepared.append(self._prepare(kind, raw, metadata))
            except (
                SchemaMismatchError,
                PoolShapeMismatchError,
                ModelFileError,
                xgb.core.XGBoostError,
                OSError,
            ) as exc:
                self._refused[kind] = version
                self.errors[kind] = str(exc)
                log.error("refused %s model %s: %s", kind, version, exc)
        if prepared:  # both kinds at once when both changed: one combined forest, not two
            self._install(prepared)
        return bool(prepared)

    def pass_over(self, kind: ModelKind, version: str, error: str) -> None:
        """Treat ``version`` as refused for ``error``, which its caller has logged: ``refresh`` does not load
        it (nor log it again) until the store's version moves."""
        self._refused[check_kind(kind)] = version
        self.errors[kind] = error

    def withdraw(self, kind: ModelKind, error: str) -> None:
        """Stop serving the ``kind`` model for ``error``, which its caller has logged (without a TTFT model
        the predictor is not ready); ``refresh`` does not load that version again until the store's moves."""
        with self._load_lock:
            model = self._models.get(check_kind(kind))
            if model is None:
                return
            models = {k: m for k, m in self._models.items() if k != kind}
            self._state = _State(models, self._joint_of(models))
            self._refused[kind] = model.metadata.version
            self.errors[kind] = error

    def load_raw(self, kind: ModelKind, raw: bytes, metadata: ModelMetadata) -> None:
        """Load booster bytes and their metadata (e.g. downloaded from a training server); make them current.

        Raises ``SchemaMismatchError`` for a model trained on another feature schema, ``ValueError`` for
        metadata of another kind.
        """
        self._install([self._prepare(kind, raw, metadata)])

    def _prepare(self, kind: ModelKind, raw: bytes, metadata: ModelMetadata) -> LoadedModel:
        """A usable model from booster bytes and metadata (compiled when possible), not yet current."""
        check_kind(kind)
        if metadata.kind != kind:
            raise ValueError(f"metadata is for a {metadata.kind} model, not {kind}")
        self.schema.check(metadata.schema, what=f"{kind} model {metadata.version}")
        if self.pool_shape is not None:
            self.pool_shape.check_saved(metadata.pool_shape, what=f"{kind} model {metadata.version}")
        booster = xgb.Booster()
        booster.load_model(bytearray(raw))
        booster.set_param({"nthread": 1})
        n_features = len(self.schema.features(kind))
        if booster.num_features() != n_features:
            raise SchemaMismatchError(
                f"{kind} model {metadata.version} has {booster.num_features()} features, "
                f"expected {n_features}"
            )
        baseline = None
        if metadata.baseline is not None:
            try:
                baseline = LinearBaseline.from_dict(metadata.baseline, self.schema.features(kind))
            except ValueError as exc:
                raise ModelFileError(f"{kind} model {metadata.version}: {exc}") from None
        forest = CompiledForest.from_booster(booster, n_features) if self.compile_forest else None
        return LoadedModel(
            kind,
            metadata,
            booster,
            forest,
            n_features,
            metadata.target_transform == "log",
            metadata.offset,
            baseline,
        )

    def _install(self, loaded: list[LoadedModel]) -> None:
        """Make ``loaded`` current, with the combined forest of the resulting pair."""
        with self._load_lock:
            models: dict[str, LoadedModel] = {**self._models, **{model.kind: model for model in loaded}}
            self._state = _State(models, self._joint_of(models))
            for model in loaded:
                self._refused.pop(model.kind, None)
                self.errors.pop(model.kind, None)
        for model in loaded:
            evaluator = "compiled" if model.forest else "xgboost"
            log.info("loaded %s model %s (%s)", model.kind, model.metadata.version, evaluator)

    def _joint_of(self, models: dict[str, LoadedModel]) -> _Joint | None:
        ttft, tpot = models.get("ttft"), models.get("tpot")
        if ttft is None or tpot is None or ttft.forest is None or tpot.forest is None:
            return None
        try:
            return _Joint(ttft, tpot, self.schema)
        except ValueError as exc:  # the combined forest disagreed with its parts: predict model by model
            log.error(
                "could not combine the %s and %s models: %s",
                ttft.metadata.version,
                tpot.metadata.version,
                exc,
            )
            return None

    # ---------------------------------------------------------------------------------- prediction

    def predict(self, x_ttft: np.ndarray, x_tpot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predicted TTFT and TPOT in ms (float64 arrays, ≥ 0) for matrices built by ``features``.

        Raises ``PredictorNotReady`` before the first TTFT model; TPOT is NaN while no TPOT model exists.
        """
        state = self._state
        models = state.models
        ttft_model = models.get("ttft")
        if ttft_model is None:
            raise PredictorNotReady("no TTFT model has been trained yet")
        if state.joint is not None:
            X = state.joint.union_of(x_ttft, x_tpot)
            if X is not None:
                return state.joint.predict(X)
        ttft = ttft_model.predict(x_ttft)
        tpot_model = models.get("tpot")
        tpot = np.full(len(x_tpot), np.nan) if tpot_model is None else tpot_model.predict(x_tpot)
        return ttft, tpot

    def predict_all(self, x_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``predict`` for rows of the union of the features, in ``schema.all_features()`` order (float32
        C-contiguous rows are used as they are), e.g. validated request rows."""
        width = len(self.schema.all_features())
        if x_all.ndim != 2 or x_all.shape[1] != width:
            raise ValueError(f"rows must have {width} features, got shape {x_all.shape}")
        state = self._state
        if "ttft" not in state.models:
            raise PredictorNotReady("no TTFT model has been trained yet")
        joint = state.joint
        if x_all.dtype != np.float32 or not x_all.flags.c_contiguous:
            x_all = np.ascontiguousarray(x_all, dtype=np.float32)
        if joint is not None and len(x_all):
            return joint.predict(x_all)
        schema = self.schema
        return self.predict(x_all[:, schema.union_columns("ttft")], x_all[:, schema.union_columns("tpot")])

    def point_factor(self, kind: ModelKind) -> float:
        """Factor from the current ``kind`` model's predictions to its point (median-like) predictions.

        exp(-offset) for a conformal model (its p90 is the point × exp(offset)), 1.0 otherwise or when no
        model is loaded.
        """
        model = self._models.get(check_kind(kind))
        return 1.0 if model is None else model.point_factor

    def predict_rows(
        self, rows: Sequence[Mapping[str, object]], *, where: str = "rows"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Validate rows carrying the union of the features (``FeatureError`` names a bad one) and predict."""
        if not self.ready:
            raise PredictorNotReady("no TTFT model has been trained yet")
        x_ttft, x_tpot = rows_to_matrices(rows, where=where, schema=self.schema)
        return self.predict(x_ttft, x_tpot)

    def status(self) -> dict[str, Any]:
        state = self._state
        models = state.models
        return {
            "ready": "ttft" in models,
            "evaluator": "compiled, both models in one pass" if state.joint is not None else "per model",
            "schema": self.schema.to_dict(),
            "models": {
                kind: None
                if (m := models.get(kind)) is None
                else {
                    "version": m.metadata.version,
                    "trained_at": m.metadata.trained_at,
                    "sample_count": m.metadata.sample_count,
                    "objective": m.metadata.objective,
                    "quantile": m.metadata.quantile,
                    "offset": m.metadata.offset,
                    "metrics": m.metadata.metrics,
                    "evaluator": "compiled" if m.forest is not None else "xgboost",
                }
                for kind in MODEL_KINDS
            },
            "errors": dict(self.errors),
        }
