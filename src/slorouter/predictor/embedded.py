"""Embedded mode (the default for ``slorouter serve``): store, trainer and predictor inside the router.

No HTTP on the hot path: ``predict`` calls the in-process ``Predictor`` directly, and ``add_sample`` writes to
the (thread-safe) ``SampleStore``. Training runs in one background thread on the trainer's cadence, and the
new model is picked up by the predictor's atomic swap, so requests never wait for a training. With
``background=False`` nothing runs by itself and the owner calls ``maybe_train()`` (the discrete-event
simulator does, in virtual time).

Warm start: with a ``state_dir`` the models live in ``state_dir/models`` and the sample window is saved to
``state_dir/samples.window`` every ``save_interval_s`` (by the training thread) and at ``stop``; ``start``
takes both over (``warm_start.StatePersistence``: what fits this pool and is at most ``max_state_age_s``
old), so a restarted router predicts at once and training resumes from the saved window; ``maybe_train``
checks what was taken over on the first live samples first, and stops serving a model they show wrong.
Without one, everything lives in a temporary directory removed by ``stop``.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from slorouter.clock import Clock, MonotonicClock
from slorouter.predictor.backend import PredictionUnavailable
from slorouter.predictor.features import DEFAULT_SCHEMA, FeatureSchema, ModelKind, check_kind, rows_to_matrix
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.pool_shape import PoolShape
from slorouter.predictor.predictor import Predictor, PredictorNotReady
from slorouter.predictor.state_dir import DEFAULT_MAX_AGE_S, MODELS, SAMPLE_WINDOW, StateDirLock
from slorouter.predictor.store import SampleStore, StoreConfig
from slorouter.predictor.trainer import Trainer, TrainerConfig, TrainingReport
from slorouter.predictor.warm_start import StatePersistence, WarmStartReport, refusal_counter

log = logging.getLogger("slorouter.predictor.embedded")


class EmbeddedPredictor:
    """The latency predictor in-process; implements ``LatencyPredictorBackend``."""

    synchronous = True  # predict_now answers in-process

    def __init__(
        self,
        state_dir: str | Path | None = None,
        *,
        store_config: StoreConfig | None = None,
        trainer_config: TrainerConfig | None = None,
        schema: FeatureSchema = DEFAULT_SCHEMA,
        clock: Clock | None = None,
        background: bool = True,
        train_poll_interval_s: float = 0.1,
        save_interval_s: float = 60.0,
        pool_shape: Callable[[], PoolShape] | None = None,
        registry: CollectorRegistry | None = None,
        max_state_age_s: float | None = DEFAULT_MAX_AGE_S,
        wall_clock: Clock | None = None,
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="slorouter-models-")
            state_dir = self._tmp.name
        self.state_dir = Path(state_dir)
        self.model_dir = self.state_dir / MODELS
        self.schema = schema
        clock = clock or MonotonicClock()
        self.store = SampleStore(store_config or StoreConfig(), schema=schema)
        self.model_store = ModelStore(self.model_dir)
        self.trainer = Trainer(self.store, self.model_store, trainer_config or TrainerConfig(), clock)
        self.predictor = Predictor(self.model_store, expected_schema=schema)
        self.persistence: StatePersistence | None = None
        if self._tmp is None:
            counter = (
                None
                if registry is None
                else refusal_counter("slorouter_predictor_warm_start_refused", registry)
            )
            self.persistence = StatePersistence(
                self.state_dir / SAMPLE_WINDOW,
                self.store,
                save_interval_s=save_interval_s,
                clock=clock,
                refused=counter,
                max_age_s=max_state_age_s,
                wall_clock=wall_clock,
            )
        self._pool_shape = pool_shape
        self._lock: StateDirLock | None = None
        self._warm = False
        self.background = background
        self.train_poll_interval_s = train_poll_interval_s
        self.training_errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self.predictor.ready

    @property
    def versions(self) -> dict[str, str | None]:
        """The model version served per kind (None before its first training)."""
        return self.predictor.versions

    @property
    def stale_servers(self) -> dict[str, dict[str, str]]:
        return {}

    def point_factor(self, kind: ModelKind) -> float:
        return self.predictor.point_factor(kind)

    def retrain_soon(self, kind: ModelKind) -> None:
        self.trainer.expedite(kind)

    @property
    def warm_start_report(self) -> WarmStartReport | None:
        """What the start took over and refused, and the live checks (None without a state directory)."""
        return None if self.persistence is None else self.persistence.report.snapshot()

    def start(self) -> None:
        """Take over the saved state (once), then start the training thread (unless ``background=False``)."""
        self.warm_start()
        if self.background and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="slorouter-embedded-trainer", daemon=True)
            self._thread.start()

    def warm_start(self) -> None:
        """Lock the state directory, load its models and sample window (what fits this pool); once."""
        if self._warm:
            return
        if self.persistence is not None:  # else a fresh temporary directory: nothing to take over
            self._lock = StateDirLock(self.state_dir)  # raises StateDirBusyError: nothing is taken over
            shape = None if self._pool_shape is None else self._pool_shape()
            self.persistence.restore(self.trainer, shape, self.predictor)
        self._warm = True

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self._lock is not None:
            assert self.persistence is not None
            await asyncio.to_thread(self.persistence.save_pending)
            self._lock.release()
            self._lock = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _loop(self) -> None:
        while not self._stop.wait(self.train_poll_interval_s):
            self.maybe_train()
            if self.persistence is not None:
                self.persistence.maybe_save()

    def maybe_train(self) -> list[TrainingReport]:
        """Check what the warm start took over, train what is due and load accepted models (the background
        thread's work; callable directly)."""
        try:
            if self.persistence is not None:
                for dropped in self.persistence.check_live(self.trainer):
                    self.predictor.withdraw(dropped.kind, dropped.error)
            reports = self.trainer.maybe_train()
        except Exception:
            self.training_errors += 1
            log.exception("embedded training failed")
            return []
        if any(report.accepted for report in reports):
            self.predictor.refresh()
        return reports

    def predict_now(self, x_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predictions for rows of the union matrix (``schema.all_features()`` columns): in-process, never
        waiting, so the hot path (and the discrete-event simulator, which has no event loop) calls this."""
        try:
            return self.predictor.predict_all(x_all)
        except PredictorNotReady as exc:
            raise PredictionUnavailable(str(exc)) from None

    async def predict(self, x_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.predict_now(x_all)

    def add_sample(self, kind: ModelKind, row: Mapping[str, float] | np.ndarray, latency_ms: float) -> None:
        check_kind(kind)
        if isinstance(row, np.ndarray):
            values = row if row.dtype == np.float32 and row.ndim == 1 else row.astype(np.float32).reshape(-1)
            width = len(self.schema.features(kind))
            if len(values) != width:
                raise ValueError(f"a {kind} feature row must have {width} values, got {row.shape}")
        else:
            values = rows_to_matrix([row], kind, where="row", schema=self.schema)[0]
        self.store.add_row(kind, values, float(latency_ms))  # checks that the values are finite
