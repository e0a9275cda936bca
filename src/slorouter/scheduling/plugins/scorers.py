"""Load scorers over scraped metrics (reference §2.2). Each returns one score in [0, 1] per candidate."""

from __future__ import annotations

import numpy as np

from slorouter.scheduling.plugin import Plugin, Scorer
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest


def min_max_inverted(values: np.ndarray) -> np.ndarray:
    """(max − v) / (max − min): the least loaded candidate scores 1, the most loaded 0; all equal → 1."""
    values = values.astype(np.float64, copy=False)
    low = values.min()
    high = values.max()
    if high == low:
        return np.ones(len(values))
    return (high - values) / (high - low)


@register_plugin
class QueueScorer(Plugin, Scorer):
    """Prefers short waiting queues (``vllm:num_requests_waiting``), min-max over the candidates."""

    type_name = "queue-scorer"

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return min_max_inverted(candidates.column("waiting"))


@register_plugin
class RunningRequestsSizeScorer(Plugin, Scorer):
    """Prefers few running requests (``vllm:num_requests_running``), min-max over the candidates."""

    type_name = "running-requests-size-scorer"

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return min_max_inverted(candidates.column("running"))


@register_plugin
class KVCacheUtilizationScorer(Plugin, Scorer):
    """Prefers free KV cache: 1 − ``vllm:kv_cache_usage_perc`` (absolute, not relative to the candidates)."""

    type_name = "kv-cache-utilization-scorer"

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return 1.0 - candidates.column("kv_usage")
