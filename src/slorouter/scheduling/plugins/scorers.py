"""Load scorers over scraped metrics (reference §2.2), and ``least-request-scorer``, the load-balancer
baseline that prefers endpoints with the fewest requests this router has in flight (Envoy ``LEAST_REQUEST``
with all candidates compared; unlike ``running-requests-size-scorer`` it reads the router-local count, which
is always fresh). Each returns one score in [0, 1] per candidate.

Each scorer also has a plain-Python twin (``score_list``) for small candidate sets; both give bit-identical
scores (see ``ListScorer``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slorouter.scheduling.plugin import ListScorer, Plugin, Scorer
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


def min_max_inverted_list(values: Sequence[float]) -> list[float]:
    """``min_max_inverted`` in plain Python (same float64 operations, so the same results)."""
    floats = [float(v) for v in values]
    if any(v != v for v in floats):  # numpy's min and max propagate NaN, making every score NaN
        return [float("nan")] * len(floats)
    low = min(floats)
    high = max(floats)
    if high == low:
        return [1.0] * len(floats)
    span = high - low
    return [(high - v) / span for v in floats]


@register_plugin
class QueueScorer(Plugin, ListScorer):
    """Prefers short waiting queues (``vllm:num_requests_waiting``), min-max over the candidates."""

    type_name = "queue-scorer"

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return min_max_inverted(candidates.column("waiting"))

    def score_list(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> list[float]:
        return min_max_inverted_list(candidates.values("waiting"))


@register_plugin
class RunningRequestsSizeScorer(Plugin, ListScorer):
    """Prefers few running requests (``vllm:num_requests_running``), min-max over the candidates."""

    type_name = "running-requests-size-scorer"

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return min_max_inverted(candidates.column("running"))

    def score_list(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> list[float]:
        return min_max_inverted_list(candidates.values("running"))


@register_plugin
class KVCacheUtilizationScorer(Plugin, ListScorer):
    """Prefers free KV cache: 1 − ``vllm:kv_cache_usage_perc`` (absolute, not relative to the candidates)."""

    type_name = "kv-cache-utilization-scorer"

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return 1.0 - candidates.column("kv_usage")

    def score_list(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> list[float]:
        return [1.0 - v for v in candidates.values("kv_usage")]


@register_plugin
class LeastRequestScorer(Plugin, Scorer):
    """Prefers few router-local in-flight requests, min-max over the candidates."""

    type_name = "least-request-scorer"

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return min_max_inverted(candidates.column("inflight_requests"))
