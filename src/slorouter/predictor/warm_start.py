"""Warm start: what a trainer's owner (the embedded predictor, the training server) keeps across restarts.

At start, ``StatePersistence.restore`` takes the models already in the model store and the saved sample
window, refusing what does not fit, for one of four reasons: state of another feature schema (``schema``),
learnt on a pool this one does not fit (``pool_shape``, see ``pool_shape.py``), older than ``max_age_s``
(``stale``: a model by its training time, the window by its save time), or a damaged file (``damaged``).

What is taken over is then checked on the first live samples (``check_live``, see ``live_check.py``): each
kind whose model or samples were taken over is not retrained until ``live_samples`` live samples its model
did not see arrived; its model is then scored on them. A model off by more than ``max_factor`` (median,
either way) is refused (``inaccurate``) together with the restored samples of its kind: it stops serving,
is retired from the model store (not taken over again at the next start), and the next training of its kind
uses live samples only, as soon as there are ``min_samples`` of them.

A refusal is expected (another pool, an upgrade, yesterday's traffic): it is logged once, at WARNING, with its
reason and what follows, and counted; the refused part then warms up as from scratch (no model until the
first training, so heuristic routing meanwhile; an empty window). Nothing refused at start is deleted: it is
replaced by the next training or save.

While running, ``maybe_save`` (called from the owner's training thread) rewrites the window every
``save_interval_s`` when samples arrived since the last save, and ``save_pending`` does so at shutdown.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from prometheus_client import CollectorRegistry, Counter

from slorouter.clock import Clock, WallClock
from slorouter.predictor.features import MODEL_KINDS, ModelKind, SchemaMismatchError
from slorouter.predictor.live_check import LIVE_SAMPLES, MAX_FACTOR, LiveCheck, LiveScore, score
from slorouter.predictor.model_store import ModelMetadata
from slorouter.predictor.pool_shape import PoolShape, PoolShapeMismatchError
from slorouter.predictor.predictor import Predictor
from slorouter.predictor.sample_window import SavedWindow, WindowFileError, read_window, save_window
from slorouter.predictor.state_dir import DEFAULT_MAX_AGE_S
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer

log = logging.getLogger("slorouter.predictor.warm_start")

Item = Literal["model", "samples"]
RefusedKind = ModelKind | Literal["all"]  # all: the whole window
RefusalReason = Literal["schema", "pool_shape", "damaged", "stale", "inaccurate"]


class StaleStateError(ValueError):
    """Saved state older than the age limit."""


class InaccurateStateError(ValueError):
    """State taken over whose model the first live samples showed wrong for this pool."""


def refusal_reason(exc: BaseException) -> RefusalReason:
    """``schema``, ``pool_shape``, ``stale``, ``inaccurate`` or ``damaged`` (anything else that made a file
    unusable)."""
    if isinstance(exc, SchemaMismatchError):
        return "schema"
    if isinstance(exc, PoolShapeMismatchError):
        return "pool_shape"
    if isinstance(exc, StaleStateError):
        return "stale"
    if isinstance(exc, InaccurateStateError):
        return "inaccurate"
    return "damaged"


def refusal_counter(name: str, registry: CollectorRegistry) -> Counter:
    """The Prometheus counter of refusals, by ``item`` (``model``, ``samples``) and ``reason``."""
    return Counter(
        name,
        "Saved state refused at start or by the live check, by item (model, samples) and reason (schema, "
        "pool_shape, damaged, stale, inaccurate).",
        ["item", "reason"],
        registry=registry,
    )


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused item, why (``reason``, and ``error`` in words)."""

    item: Item
    kind: RefusedKind
    reason: RefusalReason
    error: str


@dataclass(frozen=True, slots=True)
class DroppedModel:
    """A model the live check refused: its owner must stop serving it."""

    kind: ModelKind
    version: str
    error: str


@dataclass
class WarmStartReport:
    """What a start took over from the previous run, what it refused, and how the live check went."""

    models: dict[str, str | None] = field(default_factory=dict)  # kind -> restored version
    samples: dict[str, int] = field(default_factory=dict)  # kind -> restored samples
    saved_at: float | None = None  # unix time the restored window was written
    refused: list[Refusal] = field(default_factory=list)
    live_checks: dict[str, LiveCheck] = field(default_factory=dict)  # kind -> its check, if on probation

    def snapshot(self) -> WarmStartReport:
        """A copy that later refusals and checks leave as it is."""
        return replace(
            self,
            models=dict(self.models),
            samples=dict(self.samples),
            refused=list(self.refused),
            live_checks=dict(self.live_checks),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "models": self.models,
            "samples": self.samples,
            "saved_at": self.saved_at,
            "refused": [asdict(refusal) for refusal in self.refused],
            "live_checks": {kind: check.to_dict() for kind, check in self.live_checks.items()},
        }


def _refusal_words(item: Item, kind: str, reason: RefusalReason) -> tuple[str, str]:
    """What was refused, and what follows from it."""
    if item == "samples" and kind == "all":
        return "the saved sample window", "the window starts empty"
    if item == "samples":
        return (
            f"the restored {kind} samples",
            f"{kind.upper()} models are trained on live samples only, the next one as soon as there are "
            "min_samples of them",
        )
    live = reason == "inaccurate"
    what = f"the {'restored' if live else 'saved'} {kind} model"
    samples = "live samples" if live else "samples"
    if kind == "ttft":
        return (
            what,
            f"requests are routed by heuristics until a TTFT model is trained on this pool's {samples}",
        )
    return what, f"no {kind.upper()} prediction until one is trained on this pool's {samples}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


class StatePersistence:
    """Restores a trainer's models and sample window at start and checks them on the first live samples;
    saves the window while running and at stop."""

    def __init__(
        self,
        window_path: Path,
        store: SampleStore,
        *,
        save_interval_s: float,
        clock: Clock,
        refused: Counter | None = None,
        max_age_s: float | None = DEFAULT_MAX_AGE_S,
        wall_clock: Clock | None = None,
        live_samples: int = LIVE_SAMPLES,
        max_factor: float = MAX_FACTOR,
    ) -> None:
        if not save_interval_s > 0:
            raise ValueError(f"save_interval_s must be > 0, got {save_interval_s}")
        if max_age_s is not None and not max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0 (None: no limit), got {max_age_s}")
        if live_samples < 1 or not max_factor > 1:
            raise ValueError(
                f"live_samples must be >= 1 and max_factor > 1, got {live_samples}, {max_factor}"
            )
        self.window_path = window_path
        self.store = store
        self.save_interval_s = save_interval_s
        self.clock = clock
        self.max_age_s = max_age_s
        self.wall_clock: Clock = wall_clock or WallClock()  # unix time, for the age of what was saved
        self.live_samples = live_samples
        self.max_factor = max_factor
        self.pool_shape: PoolShape | None = None  # saved with the window: the restored and current pools'
        self.report = WarmStartReport()
        self._refused = refused
        # The kinds on probation, and the arrival number of their first live sample.
        self._first_live: dict[ModelKind, int] = {}
        self._last_save = clock.now()
        self._saved_added = self._added()
        self.saves = 0
        self.save_errors = 0

    def restore(
        self, trainer: Trainer, pool_shape: PoolShape | None, predictor: Predictor | None = None
    ) -> WarmStartReport:
        """Take over the stored models and the saved window that fit ``pool_shape`` (unchecked when None) and
        are not too old, and put them on probation; ``predictor``, if given, serves the models taken over."""
        report = WarmStartReport()
        refused_models = trainer.load_current() if pool_shape is None else trainer.set_pool_shape(pool_shape)
        refused_models.update(self._stale_models(trainer))
        for kind, exc in refused_models.items():
            self._refuse(report, "model", kind, exc)
        if predictor is not None:
            predictor.pool_shape = pool_shape
            for kind, exc in refused_models.items():  # refused and logged once, here: not loaded again
                version = trainer.model_store.latest_version(kind)
                if version is not None:
                    predictor.pass_over(kind, version, str(exc))
            predictor.refresh()
        known: list[dict[str, Any] | None] = []
        for kind in MODEL_KINDS:
            metadata = trainer.current_metadata(kind)
            report.models[kind] = None if metadata is None else metadata.version
            known.append(None if metadata is None else metadata.pool_shape)
        window = self._read_window(report, pool_shape)
        if window is not None and self._restore_window(report, trainer, window):
            report.saved_at = window.saved_at
            known.append(window.pool_shape)
        # What the restored state was learnt on, and the pool now: recorded with what is saved from now on.
        recorded = pool_shape
        for shape in (PoolShape.from_dict(item) for item in known if item is not None):
            recorded = shape if recorded is None else recorded.union(shape)
        trainer.pool_shape = recorded
        self.pool_shape = recorded
        self._start_probation(report, trainer)
        self._saved_added = self._added()
        self.report = report
        log.info(
            "warm start: models %s, samples %s from %s%s%s",
            report.models,
            report.samples or "none",
            self.window_path,
            f", refused {[(r.item, r.kind, r.reason) for r in report.refused]}" if report.refused else "",
            f"; checking {sorted(report.live_checks)} on the first {self.live_samples} live samples"
            if report.live_checks
            else "",
        )
        return report

    def refuse_restored(self, item: Item, kind: RefusedKind, exc: BaseException) -> None:
        """Count and log a refusal decided after ``restore`` (a training server learns its pool later)."""
        self._refuse(self.report, item, kind, exc)

    def _stale_models(self, trainer: Trainer) -> dict[ModelKind, Exception]:
        """Drop the current models trained longer than ``max_age_s`` ago; the refusals by kind."""
        stale: dict[ModelKind, Exception] = {}
        for kind in MODEL_KINDS:
            metadata = trainer.current_metadata(kind)
            if metadata is None:
                continue
            try:
                self._check_age(metadata.trained_at, f"stored {kind} model {metadata.version}", "trained")
            except StaleStateError as exc:
                trainer.drop_current(kind)
                stale[kind] = exc
        return stale

    def _check_age(self, at: float, what: str, done: str) -> None:
        """``StaleStateError`` when ``at`` (unix time) is more than ``max_age_s`` ago."""
        age = self.wall_clock.now() - at
        if self.max_age_s is not None and age > self.max_age_s:
            raise StaleStateError(
                f"{what} was {done} {_hours(age)} ago, more than max_state_age_s ({_hours(self.max_age_s)})"
            )

    def _read_window(self, report: WarmStartReport, pool_shape: PoolShape | None) -> SavedWindow | None:
        try:
            window = read_window(self.window_path)
            if window is None:
                return None
            what = f"the sample window {self.window_path}"
            self.store.schema.check(window.schema, what=what)
            if pool_shape is not None:
                pool_shape.check_saved(window.pool_shape, what=what)
            self._check_age(window.saved_at, what, "saved")
            for kind, saved in window.kinds.items():
                width = len(self.store.schema.features(kind))
                if saved.X.shape[1] != width:
                    raise WindowFileError(f"{kind} rows have {saved.X.shape[1]} values, the schema {width}")
            return window
        except (WindowFileError, SchemaMismatchError, PoolShapeMismatchError, OSError, ValueError) as exc:
            self._refuse(report, "samples", "all", exc)
            return None

    def _restore_window(self, report: WarmStartReport, trainer: Trainer, window: SavedWindow) -> bool:
        try:
            for kind, saved in window.kinds.items():
                # Without a model to show for them, the samples are due for training at once.
                mark = saved.trained_mark if trainer.current_version(kind) else 0
                self.store.restore(kind, saved.X, saved.y, saved.seq, saved.total_added, mark)
                report.samples[kind] = len(saved.seq)
        except ValueError as exc:  # intact bytes, inconsistent content: nothing of it is kept
            self.store.clear()
            report.samples = {}
            self._refuse(report, "samples", "all", exc)
            return False
        return True

    def _refuse(self, report: WarmStartReport, item: Item, kind: RefusedKind, exc: BaseException) -> Refusal:
        refusal = Refusal(item, kind, refusal_reason(exc), str(exc))
        report.refused.append(refusal)
        if self._refused is not None:
            self._refused.labels(item, refusal.reason).inc()
        what, then = _refusal_words(item, kind, refusal.reason)
        log.warning("warm start: refused %s (%s): %s; %s", what, refusal.reason, exc, then)
        return refusal

    # -- the live check --------------------------------------------------------------------------------------

    def _start_probation(self, report: WarmStartReport, trainer: Trainer) -> None:
        """Each kind with a model or samples taken over waits for its live check, not retrained meanwhile."""
        self._first_live = {}
        for kind in MODEL_KINDS:
            if report.models[kind] is None and not report.samples.get(kind):
                continue
            self._first_live[kind] = self.store.total_added(kind)
            trainer.hold(kind)
            report.live_checks[kind] = LiveCheck("pending", self.live_samples)

    def check_live(self, trainer: Trainer) -> list[DroppedModel]:
        """Score each model on probation once ``live_samples`` live samples it was not trained on arrived:
        keep it, or refuse it with the restored samples of its kind (``inaccurate``). Called by the owner's
        training thread before its trainings; returns the models dropped now, which the owner must stop
        serving."""
        dropped = []
        for kind in MODEL_KINDS:
            first = self._first_live.get(kind)
            if first is None or self._unseen(kind, first) < self.live_samples:
                continue
            with trainer.paused():
                refusal = self._judge(trainer, kind)
            if refusal is not None:
                dropped.append(refusal)
        return dropped

    def end_checks(self, trainer: Trainer) -> None:
        """Nothing taken over is left to check: it was refused later (by a training server's first pool
        shape)."""
        for kind in self._first_live:
            trainer.hold(kind, False)
            self.report.live_checks.pop(kind, None)
        self._first_live = {}

    def _unseen(self, kind: ModelKind, first_live: int) -> int:
        """Live samples of ``kind`` that arrived after its current model's training."""
        return self.store.total_added(kind) - max(first_live, self.store.trained_mark(kind))

    def _judge(self, trainer: Trainer, kind: ModelKind) -> DroppedModel | None:
        """The live check of ``kind`` (trainings paused); the model, if it is dropped."""
        first = self._first_live.get(kind)
        metadata = trainer.current_metadata(kind)
        if first is None or metadata is None:  # ended meanwhile, or no model trained yet
            return None
        result = self._live_score(trainer, kind, first, metadata)
        if result is None:
            return None
        check = self.report.live_checks[kind].decided(result, metadata.version, self.max_factor)
        self.report.live_checks[kind] = check
        del self._first_live[kind]
        trainer.hold(kind, False)
        scored = (
            f"{kind} model {metadata.version} predicted the first {check.samples} live samples at "
            f"{result.ratio:.2f}× the observed latencies (median, relative to its hold-out; MAPE "
            f"{result.mape:.2f})"
        )
        if check.state == "kept":
            log.info("warm start: kept the restored %s model: %s", kind, scored)
            return None
        return self._drop(trainer, kind, first, metadata.version, scored)

    def _live_score(
        self, trainer: Trainer, kind: ModelKind, first_live: int, metadata: ModelMetadata
    ) -> LiveScore | None:
        """The current model on the first ``live_samples`` live samples it did not see; None until there are
        that many."""
        snap = self.store.snapshot(kind)
        start = max(first_live, self.store.trained_mark(kind))
        unseen = np.flatnonzero(snap.seq >= start)[: self.live_samples]
        point = trainer.point_predictions(kind, snap.X[unseen])
        if len(unseen) < self.live_samples or point is None:
            return None
        return score(snap.y[unseen], point, float(metadata.metrics.get("mean_log_ratio", 0.0)))

    def _drop(
        self, trainer: Trainer, kind: ModelKind, first_live: int, version: str, scored: str
    ) -> DroppedModel:
        """Refuse the ``kind`` model and the samples restored with it: the next one learns from live samples
        only, and the model is not taken over again at the next start."""
        trainer.drop_current(kind)
        trainer.model_store.retire(kind)
        restored = self.store.drop_before(kind, first_live)
        self._saved_added = -1  # the window on disk still holds the restored samples: rewrite it
        off = f"more than {self.max_factor:g}× off"
        refusal = self._refuse(self.report, "model", kind, InaccurateStateError(f"{scored}: {off}"))
        if restored:
            learnt = (
                f"{restored} samples taken over from the previous runs; the model learnt on them was {off}"
            )
            self._refuse(self.report, "samples", kind, InaccurateStateError(f"{learnt}: {scored}"))
        return DroppedModel(kind, version, refusal.error)

    # -- saving ----------------------------------------------------------------------------------------------

    def _added(self) -> int:
        return sum(self.store.total_added(kind) for kind in MODEL_KINDS)

    def maybe_save(self) -> bool:
        """Save the window if ``save_interval_s`` passed and samples arrived since the last save."""
        if self.clock.now() - self._last_save < self.save_interval_s or self._added() == self._saved_added:
            return False
        return self.save()

    def save_pending(self) -> bool:
        """At shutdown: save the window if samples arrived since the last save (or the restore)."""
        return self._added() != self._saved_added and self.save()

    def save(self) -> bool:
        """Write the window now (atomically); False, logged, if the write failed."""
        added = self._added()
        started = time.perf_counter()
        self._last_save = self.clock.now()
        try:
            size = save_window(self.window_path, self.store, self.pool_shape, self.wall_clock.now())
        except OSError as exc:
            self.save_errors += 1
            log.error("could not save the sample window to %s: %s", self.window_path, exc)
            return False
        self._saved_added = added
        self.saves += 1
        log.debug("saved the sample window (%d bytes) in %.3fs", size, time.perf_counter() - started)
        return True
