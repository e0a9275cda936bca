"""Periodic XGBoost training from the sample store, gated by hold-out metrics.

Cadence: a kind is *due* when it holds at least ``min_samples`` samples, at least one sample arrived since
its last training, and ``retrain_interval_s`` of the injected clock passed since its last training (or it
was never trained). Nothing is trained or saved before that: there is no cold-start stub model.

Hold-out: every sample gets a fixed hold-out flag from its arrival number (a multiplicative hash, so about
``holdout_fraction`` of the samples, evenly spread, reproducible). The hold-out set is the newest
``holdout_max`` flagged samples in the store; every other sample is trained on. Flagged samples inside the
window are never trained on by any model, so the new and the current model are compared on data neither
saw (samples leave the window only by getting older or evicted, never by becoming "trainable" while in it).

Objectives (p = ``quantile``, 0.9 by default). All but ``mean`` learn log(latency): quantiles commute with
monotone transforms, so exp(prediction) is a latency quantile, and the trees fit relative errors evenly
from 10 ms to 10 s.

- ``conformal`` (default): ``reg:squarederror`` on log(latency), whose exp is the point (median-like)
  prediction, plus a split-conformal offset: the p-quantile of the log residuals on calibration samples
  no tree was trained on (finite-sample level ⌈(n+1)p⌉/n). The p90 prediction is point × exp(offset),
  stored as ``ModelMetadata.offset`` and added to the raw margin by the predictor. Squared error trains
  3–4× faster than the quantile loss (XGBoost's quantile objective re-fits every leaf by line search),
  and the calibrated offset gave closer-to-nominal coverage than the quantile loss on simulator data.
- ``quantile``: ``reg:quantileerror`` on log(latency) at p (the original's choice).
- ``mean``: ``reg:squarederror`` on the latency itself.

Calibration set (``conformal`` only): samples whose hash falls in the band after the hold-out's, about
``holdout_fraction`` more of them (the newest ``calibration_max``); like the hold-out they are never
trained on, so the offset is measured on data the trees did not see, and the hold-out's coverage stays an
honest check of it.

Replacement rule: the new model replaces the current one unless it is clearly worse on the same hold-out:
accepted iff there is no current model (or none comparable: other schema, objective or quantile), or the
hold-out is empty, or ``new_loss <= (1 + replace_tolerance) × current_loss`` (default tolerance 5 %), where
the loss is the pinball loss at p for ``conformal`` and ``quantile`` and the RMSE for ``mean``. A rejected
model is reported and dropped; the current one stays.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import xgboost as xgb

from slorouter.clock import Clock, MonotonicClock
from slorouter.predictor.baseline import LinearBaseline
from slorouter.predictor.features import (
    MODEL_KINDS,
    FeatureSchema,
    ModelKind,
    SchemaMismatchError,
    check_kind,
)
from slorouter.predictor.model_store import ModelFileError, ModelMetadata, ModelStore
from slorouter.predictor.pool_shape import PoolShape, PoolShapeMismatchError
from slorouter.predictor.store import SampleStore

log = logging.getLogger(__name__)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

Objective = Literal["conformal", "quantile", "mean"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    objective: Objective = "conformal"
    quantile: float = 0.9
    n_estimators: int = 200
    max_depth: int = 6
    learning_rate: float = 0.05
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    min_child_weight: float = 5.0
    retrain_interval_s: float = 5.0
    min_samples: int = 200
    holdout_fraction: float = 0.1
    holdout_max: int = 1000
    calibration_max: int = 2000
    nthread: int = 2
    seed: int = 0
    replace_tolerance: float = 0.05
    max_bin: int = 256
    baseline: bool = True  # a linear load baseline under the trees (log-latency objectives; see baseline.py)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")
        if not 0.0 <= self.holdout_fraction < 0.5:
            raise ValueError(f"holdout_fraction must be in [0, 0.5), got {self.holdout_fraction}")
        if self.n_estimators < 1 or self.max_depth < 1 or self.min_samples < 1 or self.nthread < 1:
            raise ValueError("n_estimators, max_depth, min_samples and nthread must be >= 1")
        if min(self.retrain_interval_s, self.replace_tolerance, self.holdout_max, self.calibration_max) < 0:
            raise ValueError(
                "retrain_interval_s, replace_tolerance, holdout_max and calibration_max must be >= 0"
            )

    @property
    def target_transform(self) -> str:
        return "identity" if self.objective == "mean" else "log"

    @property
    def predicts_quantile(self) -> bool:
        """True when the served prediction is the ``quantile`` of latency (not the mean)."""
        return self.objective != "mean"

    def xgb_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "eta": self.learning_rate,
            "max_depth": self.max_depth,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "tree_method": "hist",
            "max_bin": self.max_bin,
            "nthread": self.nthread,
            "seed": self.seed,
            "verbosity": 0,
        }
        if self.objective == "quantile":
            params.update(objective="reg:quantileerror", quantile_alpha=self.quantile)
        else:
            params["objective"] = "reg:squarederror"
        return params


@dataclass(slots=True)
class TrainingReport:
    """The outcome of one training of one kind."""

    kind: ModelKind
    accepted: bool
    reason: str
    version: str | None  # the saved version (None if rejected)
    sample_count: int
    train_count: int
    holdout_count: int
    calibration_count: int
    metrics: dict[str, float]  # the new model on the hold-out
    current_metrics: dict[str, float] | None  # the model it was compared with, same hold-out
    current_version: str | None
    duration_s: float
    trained_at: float  # unix time

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _hash_band(seq: np.ndarray) -> np.ndarray:
    return (seq.astype(np.uint64) * _GOLDEN) >> np.uint64(40)  # wraps mod 2**64; top 24 bits, evenly spread


def holdout_flags(seq: np.ndarray, fraction: float) -> np.ndarray:
    """Fixed hold-out flag of samples by arrival number: about ``fraction`` of them, evenly spread."""
    return _hash_band(seq) < np.uint64(int(fraction * (1 << 24)))


def calibration_flags(seq: np.ndarray, fraction: float) -> np.ndarray:
    """Fixed calibration flag: the next ``fraction`` of the hash range after the hold-out's band."""
    hashed = _hash_band(seq)
    low, high = int(fraction * (1 << 24)), int(2 * fraction * (1 << 24))
    return (hashed >= np.uint64(low)) & (hashed < np.uint64(high))


def conformal_offset(log_residuals: np.ndarray, quantile: float) -> float:
    """Split-conformal quantile of residuals: the ⌈(n+1)·p⌉-th smallest (0 with no residuals)."""
    n = len(log_residuals)
    if n == 0:
        return 0.0
    rank = min(n, math.ceil((n + 1) * quantile))
    return float(np.partition(np.asarray(log_residuals, dtype=np.float64), rank - 1)[rank - 1])


def holdout_metrics(
    y: np.ndarray, pred: np.ndarray, quantile: float, point: np.ndarray | None = None
) -> dict[str, float]:
    """Hold-out metrics (ms): coverage (share of y ≤ pred) and pinball loss at ``quantile`` of ``pred``;
    MAPE, MAE, RMSE and mean log ratio of the point prediction ``point`` (``pred`` itself if None)."""
    y = np.asarray(y, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.float64)
    if len(y) == 0:
        return {}
    point = pred if point is None else np.asarray(point, dtype=np.float64)
    err = y - point
    q_err = y - pred
    return {
        "count": float(len(y)),
        "mape": float(np.mean(np.abs(err) / y)),
        "mae": float(np.mean(np.abs(err))),
        "rmse": float(math.sqrt(np.mean(err * err))),
        "coverage": float(np.mean(y <= pred)),
        "pinball_loss": float(np.mean(np.maximum(quantile * q_err, (quantile - 1.0) * q_err))),
        "mean_log_ratio": float(np.mean(np.log(y / np.maximum(point, 1e-9)))),
    }


def booster_margin(booster: xgb.Booster, X: np.ndarray, baseline: LinearBaseline | None = None) -> np.ndarray:
    """The model's margin: the trees', plus the linear baseline's shift when the model has one."""
    margin = booster.inplace_predict(np.ascontiguousarray(X, dtype=np.float32)).astype(np.float64)
    return margin if baseline is None else margin + baseline.margin_shift(X)


def booster_predict_ms(
    booster: xgb.Booster,
    X: np.ndarray,
    target_transform: str,
    offset: float = 0.0,
    baseline: LinearBaseline | None = None,
) -> np.ndarray:
    """Latency predictions (ms, ≥ 0) of a booster for float32 rows (``offset`` is added to the margin)."""
    raw = booster_margin(booster, X, baseline) + offset
    return np.exp(raw) if target_transform == "log" else np.maximum(raw, 0.0)


def booster_base_score(booster: xgb.Booster) -> float:
    """The intercept XGBoost adds to every margin (stored as e.g. "[2.03E0]" by XGBoost 3)."""
    text = json.loads(booster.save_config())["learner"]["learner_model_param"]["base_score"]
    return float(str(text).strip("[]").split(",")[0])


@dataclass(slots=True)
class _Current:
    booster: xgb.Booster
    metadata: ModelMetadata
    baseline: LinearBaseline | None = None


@dataclass(slots=True)
class _KindState:
    current: _Current | None = None
    last_attempt: float | None = None  # clock time of the last training (accepted or not)
    last_report: TrainingReport | None = None
    trainings: int = 0
    accepted: int = 0
    rejected: int = 0
    held: bool = False  # no retraining while a current model exists (a warm start's live check)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Trainer:
    """Trains the TTFT and TPOT models from a ``SampleStore`` into a ``ModelStore``."""

    def __init__(
        self,
        store: SampleStore,
        model_store: ModelStore,
        config: TrainerConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.model_store = model_store
        self.config = config or TrainerConfig()
        self.clock: Clock = clock or MonotonicClock()
        self.schema: FeatureSchema = store.schema
        self._state = {kind: _KindState() for kind in MODEL_KINDS}
        self._status_lock = threading.Lock()
        self.pool_shape: PoolShape | None = None  # recorded with every model; checked on load when set
        for kind, exc in self.load_current().items():
            log.warning(
                "ignoring the stored %s model: %s; it will be replaced at the next training", kind, exc
            )

    def set_pool_shape(self, shape: PoolShape) -> dict[ModelKind, Exception]:
        """Record ``shape`` with the models trained from now on, and reload the stored models, refusing
        those learnt on a pool this one does not fit; returns the refusals."""
        self.pool_shape = shape
        return self.load_current()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No training runs inside (one in progress finishes first)."""
        with self._state["ttft"].lock, self._state["tpot"].lock:
            yield

    def load_current(self) -> dict[ModelKind, Exception]:
        """Take the models in the model store (e.g. after a restart) as the current ones, the baselines new
        models are compared with; a model that cannot be used is not, and is returned by kind."""
        refused: dict[ModelKind, Exception] = {}
        for kind in MODEL_KINDS:
            try:
                self._state[kind].current = self._load_current(kind)
            except (
                ModelFileError,
                SchemaMismatchError,
                PoolShapeMismatchError,
                OSError,
                ValueError,
                xgb.core.XGBoostError,
            ) as exc:
                self._state[kind].current = None
                refused[kind] = exc
        return refused

    def _load_current(self, kind: ModelKind) -> _Current | None:
        loaded = self.model_store.load(kind)
        if loaded is None:
            return None
        raw, metadata = loaded
        self.schema.check(metadata.schema, what=f"stored {kind} model {metadata.version}")
        if self.pool_shape is not None:
            self.pool_shape.check_saved(metadata.pool_shape, what=f"stored {kind} model {metadata.version}")
        booster = xgb.Booster()
        booster.load_model(bytearray(raw))
        baseline = None
        if metadata.baseline is not None:
            baseline = LinearBaseline.from_dict(metadata.baseline, self.schema.features(kind))
        return _Current(booster, metadata, baseline)

    def hold(self, kind: ModelKind, held: bool = True) -> None:
        """While held, ``kind`` is not retrained once it has a current model (it is trained when it has
        none): new samples stay unseen by the current model, which can then be scored on them."""
        self._state[check_kind(kind)].held = held

    def drop_current(self, kind: ModelKind) -> None:
        """Forget the current ``kind`` model (call with trainings paused): the next one is a first model,
        trained as soon as the store has ``min_samples`` samples, whatever the cadence."""
        state = self._state[check_kind(kind)]
        state.current = None
        state.last_attempt = None

    def point_predictions(self, kind: ModelKind, X: np.ndarray) -> np.ndarray | None:
        """The current ``kind`` model's point (median-like) predictions in ms for rows ``X``: without the
        conformal offset; a ``quantile`` model's quantile. None without a current model."""
        current = self._state[check_kind(kind)].current
        if current is None:
            return None
        margin = booster_margin(current.booster, X, current.baseline)
        return np.exp(margin) if current.metadata.target_transform == "log" else np.maximum(margin, 0.0)

    # --------------------------------------------------------------------------------------- cadence

    def due(self, kind: ModelKind) -> bool:
        state = self._state[check_kind(kind)]
        if state.held and state.current is not None:
            return False
        if self.store.count(kind) < self.config.min_samples or self.store.added_since_training(kind) <= 0:
            return False
        last = state.last_attempt
        return last is None or self.clock.now() - last >= self.config.retrain_interval_s

    def expedite(self, kind: ModelKind) -> None:
        """Make ``kind`` due as soon as a sample arrives, whatever its retrain interval."""
        self._state[check_kind(kind)].last_attempt = None

    def maybe_train(self) -> list[TrainingReport]:
        """Train every kind that is due; the reports of those trainings."""
        reports = []
        for kind in MODEL_KINDS:
            if self.due(kind):
                report = self.train(kind)
                if report is not None:
                    reports.append(report)
        return reports

    def run(self, stop: threading.Event, poll_interval_s: float = 0.25) -> None:
        """Loop ``maybe_train`` until ``stop`` is set (for a background thread); errors are logged."""
        while not stop.is_set():
            try:
                self.maybe_train()
            except Exception:
                log.exception("predictor training failed")
            stop.wait(poll_interval_s)

    # -------------------------------------------------------------------------------------- training

    def train(self, kind: ModelKind) -> TrainingReport | None:
        """Train ``kind`` now (whatever the cadence); None when the store holds too few samples."""
        state = self._state[check_kind(kind)]
        with state.lock:
            return self._train_locked(kind, state)

    def _train_locked(self, kind: ModelKind, state: _KindState) -> TrainingReport | None:
        cfg = self.config
        snap = self.store.snapshot(kind)
        n = len(snap.y)
        if n < cfg.min_samples:
            return None
        started = time.perf_counter()
        state.last_attempt = self.clock.now()
        self.store.mark_trained(kind, snap.total_added)

        flagged = np.flatnonzero(holdout_flags(snap.seq, cfg.holdout_fraction))
        hold = flagged[len(flagged) - min(len(flagged), cfg.holdout_max) :]
        train_mask = np.ones(n, dtype=bool)
        train_mask[hold] = False
        calib = np.empty(0, dtype=np.int64)
        if cfg.objective == "conformal":
            banded = np.flatnonzero(calibration_flags(snap.seq, cfg.holdout_fraction))
            calib = banded[len(banded) - min(len(banded), cfg.calibration_max) :]
            train_mask[calib] = False
        X_train, y_train = snap.X[train_mask], snap.y[train_mask].astype(np.float64)
        X_hold, y_hold = snap.X[hold], snap.y[hold].astype(np.float64)

        target = np.log(y_train) if cfg.target_transform == "log" else y_train
        baseline = None
        base_margin = None
        if cfg.baseline and cfg.target_transform == "log" and len(y_train):
            baseline = LinearBaseline.fit(X_train, y_train, self.schema.features(kind), seed=cfg.seed)
            base_margin = baseline.log_ms(X_train)
        # XGBoost keeps labels and margins as float32: converting first skips its own (slower) copy.
        dtrain = xgb.QuantileDMatrix(
            X_train,
            label=target.astype(np.float32),
            base_margin=None if base_margin is None else base_margin.astype(np.float32),
            max_bin=cfg.max_bin,
            nthread=cfg.nthread,
        )
        booster = _boost(cfg.xgb_params(), dtrain, cfg.n_estimators)
        booster.set_param({"nthread": 1})
        if baseline is not None:
            baseline = baseline.with_base_score(booster_base_score(booster))
        offset = 0.0
        if cfg.objective == "conformal":
            y_calib = snap.y[calib].astype(np.float64)
            X_calib = snap.X[calib]
            offset = conformal_offset(
                np.log(y_calib) - booster_margin(booster, X_calib, baseline), cfg.quantile
            )

        metric_q = cfg.quantile if cfg.predicts_quantile else 0.5
        metrics = self._holdout_metrics(booster, offset, baseline, X_hold, y_hold, metric_q)
        if cfg.objective == "conformal":
            metrics["calibration_count"] = float(len(calib))
            metrics["offset"] = offset
        current = state.current
        comparable = current is not None and self._comparable(current.metadata)
        current_metrics = None
        if current is not None and comparable and len(hold):
            current_metrics = self._holdout_metrics(
                current.booster, current.metadata.offset, current.baseline, X_hold, y_hold, metric_q
            )
        accepted, reason = self._decide(metrics, current_metrics, current is not None, comparable)

        trained_at = time.time()
        version = None
        if accepted:
            raw = bytes(booster.save_raw("ubj"))
            version = _version(trained_at, raw)
            metadata = ModelMetadata(
                kind=kind,
                version=version,
                trained_at=trained_at,
                sample_count=len(y_train),
                metrics=metrics,
                schema=self.schema.to_dict(),
                objective=cfg.objective,
                quantile=cfg.quantile if cfg.predicts_quantile else None,
                target_transform=cfg.target_transform,
                offset=offset,
                baseline=None if baseline is None else baseline.to_dict(),
                pool_shape=None if self.pool_shape is None else self.pool_shape.to_dict(),
                extra={
                    "holdout_count": len(hold),
                    "xgboost": xgb.__version__,
                    "params": cfg.xgb_params(),
                },
            )
            self.model_store.save(kind, raw, metadata)
            state.current = _Current(booster, metadata, baseline)
        report = TrainingReport(
            kind=kind,
            accepted=accepted,
            reason=reason,
            version=version,
            sample_count=n,
            train_count=len(y_train),
            calibration_count=len(calib),
            holdout_count=len(hold),
            metrics=metrics,
            current_metrics=current_metrics,
            current_version=None if current is None else current.metadata.version,
            duration_s=time.perf_counter() - started,
            trained_at=trained_at,
        )
        with self._status_lock:
            state.last_report = report
            state.trainings += 1
            state.accepted += accepted
            state.rejected += not accepted
        log.info(
            "trained %s on %d samples in %.2fs: %s (%s)", kind, n, report.duration_s, reason, _brief(metrics)
        )
        return report

    def _holdout_metrics(
        self,
        booster: xgb.Booster,
        offset: float,
        baseline: LinearBaseline | None,
        X: np.ndarray,
        y: np.ndarray,
        quantile: float,
    ) -> dict[str, float]:
        if not len(y):
            return {}
        transform = self.config.target_transform
        margin = booster_margin(booster, X, baseline)
        pred = np.exp(margin + offset) if transform == "log" else np.maximum(margin, 0.0)
        point = np.exp(margin) if self.config.objective == "conformal" else None
        return holdout_metrics(y, pred, quantile, point)

    def _comparable(self, metadata: ModelMetadata) -> bool:
        cfg = self.config
        quantile = cfg.quantile if cfg.predicts_quantile else None
        return (
            metadata.schema == self.schema.to_dict()
            and metadata.objective == cfg.objective
            and metadata.quantile == quantile
        )

    def _decide(
        self,
        metrics: dict[str, float],
        current_metrics: dict[str, float] | None,
        has_current: bool,
        comparable: bool,
    ) -> tuple[bool, str]:
        if not has_current:
            return True, "first model"
        if not comparable:
            return True, "current model not comparable (schema, objective or quantile changed)"
        if current_metrics is None or not metrics:
            return True, "no hold-out samples to compare on"
        key = "pinball_loss" if self.config.predicts_quantile else "rmse"
        new, old = metrics[key], current_metrics[key]
        limit = (1.0 + self.config.replace_tolerance) * old
        if new <= limit:
            return (
                True,
                f"{key} {new:.4g} <= {limit:.4g} (current {old:.4g} + {self.config.replace_tolerance:.0%})",
            )
        return False, f"clearly worse: {key} {new:.4g} > {limit:.4g} (current {old:.4g})"

    # ---------------------------------------------------------------------------------------- status

    def current_metadata(self, kind: ModelKind) -> ModelMetadata | None:
        current = self._state[check_kind(kind)].current
        return None if current is None else current.metadata

    def current_version(self, kind: ModelKind) -> str | None:
        metadata = self.current_metadata(kind)
        return None if metadata is None else metadata.version

    def status(self) -> dict[str, Any]:
        """JSON-serialisable state: samples, buckets, versions, last metrics and training durations."""
        cfg = self.config
        models: dict[str, Any] = {}
        for kind in MODEL_KINDS:
            state = self._state[kind]
            with self._status_lock:
                report = state.last_report
                counters = {
                    "trainings": state.trainings,
                    "accepted": state.accepted,
                    "rejected": state.rejected,
                }
            current = state.current
            models[kind] = {
                "samples": self.store.count(kind),
                "samples_added_total": self.store.total_added(kind),
                "added_since_training": self.store.added_since_training(kind),
                "buckets": self.store.bucket_counts(kind),
                "version": None if current is None else current.metadata.version,
                "metrics": None if current is None else current.metadata.metrics,
                "trained_at": None if current is None else current.metadata.trained_at,
                "last_training": None if report is None else report.to_dict(),
                "last_training_duration_s": None if report is None else report.duration_s,
                **counters,
            }
        return {
            "objective": cfg.objective,
            "quantile": cfg.quantile if cfg.predicts_quantile else None,
            "min_samples": cfg.min_samples,
            "retrain_interval_s": cfg.retrain_interval_s,
            "schema": self.schema.to_dict(),
            "models": models,
        }


def _boost(params: dict[str, Any], dtrain: xgb.DMatrix, rounds: int) -> xgb.Booster:
    """``xgb.train(params, dtrain, num_boost_round=rounds)`` without its callback machinery (an evaluation
    monitor that has nothing to evaluate, called after every round): the same updates, the same model."""
    booster = xgb.Booster(params, [dtrain])
    for i in range(rounds):
        booster.update(dtrain, iteration=i)
    return booster.reset()  # as xgb.train: drop the training caches


def _version(trained_at: float, raw: bytes) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(trained_at))
    millis = int((trained_at % 1) * 1000)
    return f"{stamp}.{millis:03d}Z-{hashlib.sha256(raw).hexdigest()[:10]}"


def _brief(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.3g}" for k, v in metrics.items() if k != "count")
