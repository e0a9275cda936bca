"""Warm start: what a trainer's owner (the embedded predictor, the training server) keeps across restarts.

At start, ``StatePersistence.restore`` takes the models already in the model store and the saved sample
window, refusing what does not fit, for one of three reasons: state of another feature schema (``schema``),
learnt on a pool this one does not fit (``pool_shape``, see ``pool_shape.py``), or a damaged file
(``damaged``). A refusal is expected (another pool, an upgrade): it is logged once, at WARNING, with its
reason and what follows, and counted; the refused part then warms up as from scratch (no model until the
first training, so heuristic routing meanwhile; an empty window). Nothing refused is deleted: it is
replaced by the next training or save.

While running, ``maybe_save`` (called from the owner's training thread) rewrites the window every
``save_interval_s`` when samples arrived since the last save, and ``save_pending`` does so at shutdown.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from slorouter.clock import Clock
from slorouter.predictor.features import MODEL_KINDS, SchemaMismatchError
from slorouter.predictor.pool_shape import PoolShape, PoolShapeMismatchError
from slorouter.predictor.predictor import Predictor
from slorouter.predictor.sample_window import SavedWindow, WindowFileError, read_window, save_window
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer

log = logging.getLogger("slorouter.predictor.warm_start")


def refusal_reason(exc: BaseException) -> str:
    """``schema``, ``pool_shape`` or ``damaged`` (anything else that made a file unusable)."""
    if isinstance(exc, SchemaMismatchError):
        return "schema"
    if isinstance(exc, PoolShapeMismatchError):
        return "pool_shape"
    return "damaged"


def refusal_counter(name: str, registry: CollectorRegistry) -> Counter:
    """The Prometheus counter of refusals, by ``item`` (``model``, ``samples``) and ``reason``."""
    return Counter(
        name,
        "Saved state refused at start, by item (model, samples) and reason (schema, pool_shape, damaged).",
        ["item", "reason"],
        registry=registry,
    )


@dataclass
class WarmStartReport:
    """What a start took over from the previous run, and what it refused."""

    models: dict[str, str | None] = field(default_factory=dict)  # kind -> restored version
    samples: dict[str, int] = field(default_factory=dict)  # kind -> restored samples
    saved_at: float | None = None  # unix time the restored window was written
    refused: list[dict[str, str]] = field(default_factory=list)  # {"item", "kind", "reason", "error"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "models": self.models,
            "samples": self.samples,
            "saved_at": self.saved_at,
            "refused": self.refused,
        }


def _refusal_words(item: str, kind: str) -> tuple[str, str]:
    """What was refused, and what follows from it."""
    if item != "model":
        return "the saved sample window", "the window starts empty"
    if kind == "ttft":
        return (
            "the saved ttft model",
            "requests are routed by heuristics until a TTFT model is trained on this pool's samples",
        )
    then = f"no {kind.upper()} prediction until one is trained on this pool's samples"
    return f"the saved {kind} model", then


class StatePersistence:
    """Restores a trainer's models and sample window at start; saves the window while running and at stop."""

    def __init__(
        self,
        window_path: Path,
        store: SampleStore,
        *,
        save_interval_s: float,
        clock: Clock,
        refused: Counter | None = None,
    ) -> None:
        if not save_interval_s > 0:
            raise ValueError(f"save_interval_s must be > 0, got {save_interval_s}")
        self.window_path = window_path
        self.store = store
        self.save_interval_s = save_interval_s
        self.clock = clock
        self.pool_shape: PoolShape | None = None  # saved with the window: the restored and current pools'
        self.report = WarmStartReport()
        self._refused = refused
        self._last_save = clock.now()
        self._saved_added = self._added()
        self.saves = 0
        self.save_errors = 0

    def restore(
        self, trainer: Trainer, pool_shape: PoolShape | None, predictor: Predictor | None = None
    ) -> WarmStartReport:
        """Take over the stored models and the saved window that fit ``pool_shape`` (unchecked when None);
        ``predictor``, if given, serves the models taken over."""
        report = WarmStartReport()
        refused_models = trainer.load_current() if pool_shape is None else trainer.set_pool_shape(pool_shape)
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
        self._saved_added = self._added()
        self.report = report
        log.info(
            "warm start: models %s, samples %s from %s%s",
            report.models,
            report.samples or "none",
            self.window_path,
            f", refused {[(r['item'], r['kind'], r['reason']) for r in report.refused]}"
            if report.refused
            else "",
        )
        return report

    def refuse_restored(self, item: str, kind: str, exc: BaseException) -> None:
        """Count and log a refusal decided after ``restore`` (a training server learns its pool later)."""
        self._refuse(self.report, item, kind, exc)

    def _read_window(self, report: WarmStartReport, pool_shape: PoolShape | None) -> SavedWindow | None:
        try:
            window = read_window(self.window_path)
            if window is None:
                return None
            self.store.schema.check(window.schema, what=f"the sample window {self.window_path}")
            if pool_shape is not None:
                pool_shape.check_saved(window.pool_shape, what=f"the sample window {self.window_path}")
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

    def _refuse(self, report: WarmStartReport, item: str, kind: str, exc: BaseException) -> None:
        reason = refusal_reason(exc)
        report.refused.append({"item": item, "kind": kind, "reason": reason, "error": str(exc)})
        if self._refused is not None:
            self._refused.labels(item, reason).inc()
        what, then = _refusal_words(item, kind)
        log.warning("warm start: refused %s (%s): %s; %s", what, reason, exc, then)

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
            size = save_window(self.window_path, self.store, self.pool_shape)
        except OSError as exc:
            self.save_errors += 1
            log.error("could not save the sample window to %s: %s", self.window_path, exc)
            return False
        self._saved_added = added
        self.saves += 1
        log.debug("saved the sample window (%d bytes) in %.3fs", size, time.perf_counter() - started)
        return True
