"""The training-sample store: a sliding window per stratum, so rare load regimes are not forgotten.

Samples of each model kind fall into buckets by load regime, and each bucket keeps only its newest
``per_bucket`` samples (a ring buffer). A burst of traffic in one regime therefore evicts only older samples
of that regime, while sparse regimes (deep queues, a full KV cache) keep their samples much longer.

Bucket of a sample (``StoreConfig`` sets the counts; defaults 5 × 20 × 4 = 400 buckets per kind):

- queue: ``min(floor(log2(num_request_waiting + 1)), queue_buckets − 1)``; with 5 buckets the waiting
  counts 0 | 1–2 | 3–6 | 7–14 | ≥15 (close to the original's 0 | 1–2 | 3–5 | 6–10 | ≥11, but a formula that
  works for any bucket count).
- KV: ``min(floor(kv_cache_percentage × kv_buckets), kv_buckets − 1)`` (5 % wide by default).
- prefix: ``min(floor(prefix_cache_score × prefix_buckets), prefix_buckets − 1)`` for TTFT; TPOT has no
  prefix feature, so its samples all use prefix bucket 0 (its window is queue × KV buckets).

Memory is bounded and allocated up front: per kind, ``buckets × per_bucket`` rows of float32 features plus
the latency and an int64 arrival sequence number (about 6.4 MB per kind with the defaults; pages the OS has
not touched cost nothing). All methods are thread-safe: the trainer snapshots while samples keep arriving.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from slorouter.predictor.features import (
    DEFAULT_SCHEMA,
    KV_CACHE_PERCENTAGE,
    MODEL_KINDS,
    NUM_REQUEST_WAITING,
    PREFIX_CACHE_SCORE,
    FeatureError,
    FeatureSchema,
    ModelKind,
    check_kind,
)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    queue_buckets: int = 5
    kv_buckets: int = 20
    prefix_buckets: int = 4
    per_bucket: int = 500

    def __post_init__(self) -> None:
        for name in ("queue_buckets", "kv_buckets", "prefix_buckets", "per_bucket"):
            if getattr(self, name) < 1:
                raise ValueError(f"StoreConfig.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def num_buckets(self) -> int:
        return self.queue_buckets * self.kv_buckets * self.prefix_buckets


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A copy of one kind's samples, oldest first."""

    X: np.ndarray  # float32 (n, n_features)
    y: np.ndarray  # float32 latency in ms
    seq: np.ndarray  # int64 arrival sequence numbers (increasing)
    total_added: int  # samples ever added to this kind when the snapshot was taken


# Single rows (the router's samples, one per response) wait in a list and are written as one batch when a
# reader needs them or this many have gathered: a numpy write per row costs more than the whole batch does.
_PENDING_ROWS = 1024


class _Ring:
    __slots__ = ("X", "added", "count", "head", "pending_X", "pending_y", "seq", "trained_mark", "y")

    def __init__(self, buckets: int, per_bucket: int, width: int) -> None:
        self.X = np.zeros((buckets * per_bucket, width), dtype=np.float32)
        self.y = np.zeros(buckets * per_bucket, dtype=np.float32)
        self.seq = np.full(buckets * per_bucket, -1, dtype=np.int64)
        self.head = np.zeros(buckets, dtype=np.int64)  # next slot to write in each bucket
        self.count = np.zeros(buckets, dtype=np.int64)
        self.added = 0  # includes the pending rows
        self.trained_mark = 0
        self.pending_X: list[list[float]] = []
        self.pending_y: list[float] = []


class SampleStore:
    """Stratified sliding windows of (features, latency) samples for the TTFT and TPOT models."""

    def __init__(self, config: StoreConfig | None = None, *, schema: FeatureSchema = DEFAULT_SCHEMA) -> None:
        self.config = config or StoreConfig()
        self.schema = schema
        self._lock = threading.Lock()
        self._rings = {
            kind: _Ring(self.config.num_buckets, self.config.per_bucket, len(schema.features(kind)))
            for kind in MODEL_KINDS
        }
        self._columns = {
            kind: {name: j for j, name in enumerate(schema.features(kind))} for kind in MODEL_KINDS
        }

    def bucket_of(self, kind: ModelKind, X: np.ndarray) -> np.ndarray:
        """Bucket of each row of ``X`` (a ``kind`` matrix): ``(queue·kv_buckets + kv)·prefix_buckets + p``.

        Rows are assumed valid (``features`` checked them); out-of-range fractions are clipped.
        """
        cfg = self.config
        cols = self._columns[check_kind(kind)]
        waiting = X[:, cols[NUM_REQUEST_WAITING]].astype(np.float64)
        queue = np.minimum(np.floor(np.log2(waiting + 1.0)), cfg.queue_buckets - 1).astype(np.int64)
        kv = np.clip(X[:, cols[KV_CACHE_PERCENTAGE]].astype(np.float64), 0.0, 1.0)
        kv_bucket = np.minimum((kv * cfg.kv_buckets).astype(np.int64), cfg.kv_buckets - 1)
        if PREFIX_CACHE_SCORE in cols:
            prefix = np.clip(X[:, cols[PREFIX_CACHE_SCORE]].astype(np.float64), 0.0, 1.0)
            prefix_bucket = np.minimum((prefix * cfg.prefix_buckets).astype(np.int64), cfg.prefix_buckets - 1)
        else:
            prefix_bucket = np.zeros(len(X), dtype=np.int64)
        return (queue * cfg.kv_buckets + kv_bucket) * cfg.prefix_buckets + prefix_bucket

    def bucket_name(self, bucket: int) -> str:
        cfg = self.config
        rest, prefix = divmod(int(bucket), cfg.prefix_buckets)
        queue, kv = divmod(rest, cfg.kv_buckets)
        return f"queue_{queue}_kv_{kv}_prefix_{prefix}"

    def add(self, kind: ModelKind, X: np.ndarray, y_ms: np.ndarray) -> int:
        """Add validated feature rows and their latencies (ms, > 0); returns the number of rows added.

        Raises ``FeatureError`` (and adds nothing) on a latency that is not a positive finite number, or a
        matrix of the wrong shape. Within a bucket the oldest samples are overwritten first.
        """
        ring = self._rings[check_kind(kind)]
        X = np.asarray(X, dtype=np.float32)
        y = np.asarray(y_ms, dtype=np.float64)
        width = ring.X.shape[1]
        if X.ndim != 2 or X.shape[1] != width:
            raise FeatureError(f"{kind} samples must have {width} feature columns, got shape {X.shape}")
        if y.shape != (len(X),):
            raise FeatureError(f"expected {len(X)} latencies, got shape {y.shape}")
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(y) & (y > 0.0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FeatureError(
                f"latency_ms[{i}]: must be a positive finite number of milliseconds, got {y[i]}",
                index=i,
                field="latency_ms",
            )
        m = len(X)
        if m == 0:
            return 0
        with self._lock:
            if m == 1:
                self._add_pending(kind, ring, X[0].tolist(), float(y[0]))
            else:
                self._flush(kind, ring)
                self._write(kind, ring, X, y, ring.added + np.arange(m))
                ring.added += m
        return m

    def add_row(self, kind: ModelKind, row: np.ndarray, latency_ms: float) -> None:
        """``add`` for one feature row (the router's case, once per response): checked (shape, finite
        values, latency) and queued without numpy work. Raises ``FeatureError`` and adds nothing on a bad
        row or latency."""
        ring = self._rings[check_kind(kind)]
        width = ring.X.shape[1]
        if row.shape != (width,):
            raise FeatureError(f"{kind} samples must have {width} feature columns, got shape {row.shape}")
        if not (latency_ms > 0.0 and math.isfinite(latency_ms)):
            raise FeatureError(
                f"latency_ms[0]: must be a positive finite number of milliseconds, got {latency_ms}",
                index=0,
                field="latency_ms",
            )
        values = row.tolist()
        if not all(map(math.isfinite, values)):
            raise FeatureError(f"the {kind} feature row contains NaN or infinite values: {values}")
        with self._lock:
            self._add_pending(kind, ring, values, float(latency_ms))

    def _add_pending(self, kind: ModelKind, ring: _Ring, values: list[float], latency_ms: float) -> None:
        ring.pending_X.append(values)
        ring.pending_y.append(latency_ms)
        ring.added += 1
        if len(ring.pending_y) >= _PENDING_ROWS:
            self._flush(kind, ring)

    def _flush(self, kind: ModelKind, ring: _Ring) -> None:
        """Write the pending rows (the caller holds the lock). The same slots and sequence numbers as if each
        row had been written on arrival: rows land in arrival order, each bucket keeping its newest."""
        if not ring.pending_y:
            return
        X = np.array(ring.pending_X, dtype=np.float32)
        y = np.array(ring.pending_y, dtype=np.float64)
        ring.pending_X, ring.pending_y = [], []
        self._write(kind, ring, X, y, ring.added - len(y) + np.arange(len(y)))

    def _write(self, kind: ModelKind, ring: _Ring, X: np.ndarray, y: np.ndarray, seq: np.ndarray) -> None:
        """Write rows with arrival numbers ``seq`` (increasing) into their buckets (lock held)."""
        m = len(X)
        per = self.config.per_bucket
        buckets = self.bucket_of(kind, X)
        order = np.argsort(buckets, kind="stable")
        sorted_buckets = buckets[order]
        rank = np.arange(m) - np.searchsorted(sorted_buckets, sorted_buckets, side="left")
        sizes = np.bincount(buckets, minlength=self.config.num_buckets)
        keep = rank >= sizes[sorted_buckets] - per  # a batch larger than a bucket keeps its newest rows
        rows, ranks, kept_buckets = order[keep], rank[keep], sorted_buckets[keep]
        dest = kept_buckets * per + (ring.head[kept_buckets] + ranks) % per
        ring.X[dest] = X[rows]
        ring.y[dest] = y[rows]
        ring.seq[dest] = seq[rows]
        ring.head = (ring.head + sizes) % per
        np.minimum(ring.count + sizes, per, out=ring.count)

    def count(self, kind: ModelKind) -> int:
        ring = self._rings[check_kind(kind)]
        with self._lock:
            self._flush(kind, ring)
            return int(ring.count.sum())

    def total_added(self, kind: ModelKind) -> int:
        ring = self._rings[check_kind(kind)]
        with self._lock:
            return ring.added

    def bucket_counts(self, kind: ModelKind) -> dict[str, int]:
        """Samples held per non-empty bucket, by name (``queue_Q_kv_K_prefix_P``)."""
        ring = self._rings[check_kind(kind)]
        with self._lock:
            self._flush(kind, ring)
            counts = ring.count.copy()
        return {self.bucket_name(int(b)): int(counts[b]) for b in np.flatnonzero(counts)}

    def snapshot(self, kind: ModelKind) -> Snapshot:
        """A consistent copy of ``kind``'s samples, oldest first."""
        ring = self._rings[check_kind(kind)]
        with self._lock:
            self._flush(kind, ring)
            slots = np.flatnonzero(ring.seq >= 0)
            seq = ring.seq[slots]
            X, y, added = ring.X[slots], ring.y[slots], ring.added
        order = np.argsort(seq, kind="stable")
        return Snapshot(X=X[order], y=y[order], seq=seq[order], total_added=added)

    def training_arrays(self, kind: ModelKind) -> tuple[np.ndarray, np.ndarray]:
        """All of ``kind``'s samples (features float32, latency ms float32), oldest first."""
        snap = self.snapshot(kind)
        return snap.X, snap.y

    def restore(
        self,
        kind: ModelKind,
        X: np.ndarray,
        y_ms: np.ndarray,
        seq: np.ndarray,
        total_added: int,
        trained_mark: int,
    ) -> None:
        """Put back ``kind``'s samples saved from a store of the same schema (a ``snapshot``, its
        ``total_added`` and ``trained_mark``), keeping their arrival numbers: the trainer's hold-out and
        calibration flags derive from them. The kind must hold nothing yet. With another bucket configuration
        each bucket keeps its newest samples. ``ValueError`` (and nothing restored) on inconsistent data."""
        ring = self._rings[check_kind(kind)]
        X = np.asarray(X, dtype=np.float32)
        y = np.asarray(y_ms, dtype=np.float64)
        seq = np.asarray(seq, dtype=np.int64)
        n = len(seq)
        if X.shape != (n, ring.X.shape[1]) or y.shape != (n,):
            raise ValueError(f"{kind}: {n} arrival numbers, features of shape {X.shape}, latencies {y.shape}")
        if n and (seq[0] < 0 or seq[-1] >= total_added or np.any(np.diff(seq) <= 0)):
            raise ValueError(f"{kind}: arrival numbers must increase, from 0 up to total_added {total_added}")
        if not 0 <= trained_mark <= total_added:
            raise ValueError(f"{kind}: trained_mark {trained_mark} is not within 0..{total_added}")
        with np.errstate(invalid="ignore"):
            if not (np.isfinite(X).all() and np.isfinite(y).all() and (y > 0).all()):
                raise ValueError(f"{kind}: features must be finite and latencies positive and finite")
        with self._lock:
            if ring.added or ring.pending_y:
                raise ValueError(f"{kind}: restore needs an empty store")
            if n:
                self._write(kind, ring, X, y, seq)
            ring.added = int(total_added)
            ring.trained_mark = int(trained_mark)

    def trained_mark(self, kind: ModelKind) -> int:
        """``total_added`` of the samples the last training used (see ``mark_trained``)."""
        ring = self._rings[check_kind(kind)]
        with self._lock:
            return ring.trained_mark

    def mark_trained(self, kind: ModelKind, total_added: int) -> None:
        """Record that a training used the samples added up to ``total_added`` (a ``Snapshot`` field)."""
        ring = self._rings[check_kind(kind)]
        with self._lock:
            ring.trained_mark = max(ring.trained_mark, total_added)

    def added_since_training(self, kind: ModelKind) -> int:
        ring = self._rings[check_kind(kind)]
        with self._lock:
            return ring.added - ring.trained_mark

    def drop_before(self, kind: ModelKind, first_seq: int) -> int:
        """Drop ``kind``'s samples that arrived before arrival number ``first_seq`` (e.g. those restored from
        a previous run), keeping the newer ones in their buckets; the counter of samples ever added and the
        training mark are kept. Returns the number dropped."""
        ring = self._rings[check_kind(kind)]
        with self._lock:
            self._flush(kind, ring)
            held = ring.seq >= 0
            kept = np.flatnonzero(ring.seq >= first_seq)
            order = kept[np.argsort(ring.seq[kept], kind="stable")]
            X, y, seq = ring.X[order], ring.y[order].astype(np.float64), ring.seq[order]
            dropped = int(held.sum()) - len(kept)
            ring.seq.fill(-1)
            ring.head.fill(0)
            ring.count.fill(0)
            if len(seq):
                self._write(kind, ring, X, y, seq)
        return dropped

    def clear(self, kind: ModelKind | None = None) -> None:
        """Drop the samples of ``kind`` (both kinds if None); counters of samples ever added are kept."""
        with self._lock:
            for k in MODEL_KINDS if kind is None else (check_kind(kind),):
                ring = self._rings[k]
                ring.pending_X, ring.pending_y = [], []
                ring.seq.fill(-1)
                ring.head.fill(0)
                ring.count.fill(0)

    def capacity(self, kind: ModelKind) -> int:
        """The most samples ``kind`` can hold (its reachable buckets × ``per_bucket``)."""
        cfg = self.config
        prefix = cfg.prefix_buckets if PREFIX_CACHE_SCORE in self._columns[check_kind(kind)] else 1
        return cfg.queue_buckets * cfg.kv_buckets * prefix * cfg.per_bucket

    def memory_bytes(self) -> int:
        """Bytes held by the preallocated buffers (constant: the store never grows)."""
        return sum(
            r.X.nbytes + r.y.nbytes + r.seq.nbytes + r.head.nbytes + r.count.nbytes
            for r in self._rings.values()
        )
