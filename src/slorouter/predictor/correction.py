"""Per-endpoint online correction of predictions, for pools whose replicas are not all alike.

One model serves the whole pool. When replicas differ (another GPU type, a noisy neighbour, another
serving configuration) and no pod-class label tells the model so, each endpoint gets a multiplicative
factor learned from its own completed requests: the ratio of the actual latency to the model's *raw*
prediction (the prediction before any correction; feeding corrected predictions back would chase its own
tail).

The factor is a recency-weighted quantile of the endpoint's log ratios: sample weights halve every
``half_life_samples`` observations (an EWMA in log space, but of a quantile rather than a mean, so the
factor keeps the model's meaning), over the last ``window`` observations. With ``quantile`` equal to the
model's (0.9 by default), ``factor × p90 prediction`` is that endpoint's own p90: an endpoint behaving like
the training data gets ≈ 1, one running twice as slow gets ≈ 2. Use 0.5 with a mean model.

Robustness: ratios outside ``[1/max_ratio, max_ratio]`` (timeouts, aborted streams, clock glitches) are
ignored, the factor is clipped to ``[min_factor, max_factor]``, an endpoint with fewer than ``min_samples``
observations gets 1.0, and ``forget``/``retain`` drop departed endpoints so a pod that comes back (maybe as
another machine) starts afresh. Thread-safe.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat

import numpy as np

from slorouter.predictor.features import MODEL_KINDS, ModelKind, check_kind


class _Series:
    __slots__ = ("count", "factor", "head", "sorted_slots", "sorted_values", "values")

    def __init__(self, window: int) -> None:
        self.values = [0.0] * window  # a ring of log ratios
        self.head = 0  # next slot to write
        self.count = 0
        self.factor = 1.0
        # The observations in the window in ascending order of value, and the ring slot of each.
        self.sorted_values: list[float] = []
        self.sorted_slots: list[int] = []

    def put(self, value: float, window: int) -> None:
        slot = self.head
        sorted_values, sorted_slots = self.sorted_values, self.sorted_slots
        if self.count >= window:  # the slot's old value leaves the window
            i = bisect_left(sorted_values, self.values[slot])
            while sorted_slots[i] != slot:  # equal values: find this slot's
                i += 1
            del sorted_values[i], sorted_slots[i]
        i = bisect_right(sorted_values, value)
        sorted_values.insert(i, value)
        sorted_slots.insert(i, slot)
        self.values[slot] = value
        self.head = (slot + 1) % window
        self.count += 1


@dataclass(slots=True)
class _Aligned:
    endpoints: list[str]
    index: dict[str, int]
    factors: np.ndarray


class EndpointCorrection:
    """Learns a latency factor per (endpoint, model kind) from actual / predicted ratios."""

    def __init__(
        self,
        half_life_samples: float = 16.0,
        min_samples: int = 12,
        *,
        quantile: float = 0.9,
        window: int = 64,
        max_ratio: float = 20.0,
        min_factor: float = 0.2,
        max_factor: float = 5.0,
    ) -> None:
        if half_life_samples <= 0 or min_samples < 1 or window < min_samples:
            raise ValueError("need half_life_samples > 0 and 1 <= min_samples <= window")
        if not 0.0 < quantile < 1.0 or max_ratio <= 1.0 or not 0 < min_factor <= 1.0 <= max_factor:
            raise ValueError("need 0 < quantile < 1, max_ratio > 1 and 0 < min_factor <= 1 <= max_factor")
        self.half_life_samples = half_life_samples
        self.min_samples = min_samples
        self.quantile = quantile
        self.window = window
        self._log_max_ratio = math.log(max_ratio)
        self.min_factor = min_factor
        self.max_factor = max_factor
        # Weight of the observation k steps old: 2^(-k / half_life); index 0 = newest.
        self._decay = np.exp2(-np.arange(window) / half_life_samples)
        # The same weights by ring slot, per ring head: row h, slot s holds the weight of the observation
        # (h - 1 - s) mod window steps old, so a quantile needs no reordering of the ring.
        ages = (np.arange(window)[:, None] - 1 - np.arange(window)[None, :]) % window
        self._slot_weights: list[list[float]] = self._decay[ages].tolist()
        self._series: dict[tuple[str, str], _Series] = {}
        # Factors of the series with at least min_samples observations, per kind (what ``factors`` reads).
        self._active: dict[str, dict[str, float]] = {kind: {} for kind in MODEL_KINDS}
        # ``factors`` of the last endpoint list asked for, per kind, kept up to date from the endpoints
        # whose factor changed since: the router asks for the same candidate list request after request.
        self._aligned: dict[str, _Aligned | None] = {kind: None for kind in MODEL_KINDS}
        self._changed: dict[str, set[str]] = {kind: set() for kind in MODEL_KINDS}
        self._lock = threading.Lock()
        self.ignored = 0  # observations dropped as absurd

    def observe(self, endpoint: str, kind: ModelKind, predicted_ms: float, actual_ms: float) -> bool:
        """Record one completed request's raw prediction and actual latency; False if it was ignored."""
        check_kind(kind)
        if not (predicted_ms > 0.0 and actual_ms > 0.0) or not math.isfinite(predicted_ms * actual_ms):
            self.ignored += 1
            return False
        log_ratio = math.log(actual_ms / predicted_ms)
        if abs(log_ratio) > self._log_max_ratio:
            self.ignored += 1
            return False
        with self._lock:
            series = self._series.get((endpoint, kind))
            if series is None:
                series = self._series[(endpoint, kind)] = _Series(self.window)
            series.put(log_ratio, self.window)
            if series.count >= self.min_samples:
                series.factor = self._active[kind][endpoint] = self._factor(series)
                self._changed[kind].add(endpoint)
        return True

    def _factor(self, series: _Series) -> float:
        """The weighted quantile: the smallest value whose cumulative weight, in ascending order of value,
        reaches ``quantile`` × the total (builtins only: on 64 numbers numpy call overheads dominate)."""
        weights = self._slot_weights[series.head]
        cumulative = list(accumulate(map(weights.__getitem__, series.sorted_slots)))
        i = bisect_left(cumulative, self.quantile * cumulative[-1])
        value = series.sorted_values[min(i, len(cumulative) - 1)]
        return min(max(math.exp(value), self.min_factor), self.max_factor)

    def factor(self, endpoint: str, kind: ModelKind) -> float:
        series = self._series.get((endpoint, check_kind(kind)))
        return 1.0 if series is None or series.count < self.min_samples else series.factor

    def factors(self, endpoints: Sequence[str], kind: ModelKind) -> np.ndarray:
        """Factor per endpoint, in order (1.0 for unknown endpoints and those with too few samples)."""
        check_kind(kind)
        with self._lock:
            active = self._active[kind]
            if not active:
                return np.ones(len(endpoints), dtype=np.float64)
            aligned = self._aligned[kind]
            changed = self._changed[kind]
            if aligned is not None and isinstance(endpoints, list) and aligned.endpoints == endpoints:
                index, out = aligned.index, aligned.factors
                for endpoint in changed:
                    i = index.get(endpoint)
                    if i is not None:
                        out[i] = active.get(endpoint, 1.0)
            else:
                out = np.fromiter(map(active.get, endpoints, repeat(1.0)), np.float64, len(endpoints))
                index = {endpoint: i for i, endpoint in enumerate(endpoints)}
                if len(index) == len(out):  # (a list with duplicates is not kept: one slot per endpoint)
                    self._aligned[kind] = _Aligned(list(endpoints), index, out)
            changed.clear()
            return out.copy()

    def samples(self, endpoint: str, kind: ModelKind) -> int:
        series = self._series.get((endpoint, check_kind(kind)))
        return 0 if series is None else series.count

    def forget(self, endpoint: str) -> None:
        """Drop everything learned about ``endpoint`` (it left the pool)."""
        with self._lock:
            for key in [key for key in self._series if key[0] == endpoint]:
                del self._series[key]
                self._active[key[1]].pop(endpoint, None)
                self._changed[key[1]].add(endpoint)

    def retain(self, endpoints: Iterable[str]) -> None:
        """Forget every endpoint not in ``endpoints`` (call with the current pool membership)."""
        keep = set(endpoints)
        with self._lock:
            for key in [key for key in self._series if key[0] not in keep]:
                del self._series[key]
                self._active[key[1]].pop(key[0], None)
                self._changed[key[1]].add(key[0])

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{endpoint: {kind: factor}}`` of endpoints with enough samples (for status pages)."""
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for (endpoint, kind), series in self._series.items():
                if series.count >= self.min_samples:
                    out.setdefault(endpoint, {})[kind] = series.factor
        return out
