"""Load-balancer baselines that routers are compared with: round-robin and least-request.

- ``round-robin-picker``: endpoints in turn, in pool order (Kubernetes Service / Envoy ``ROUND_ROBIN``);
  filtered-out or unhealthy endpoints are skipped, the scores are ignored.
- ``least-request-scorer``: prefers endpoints with the fewest requests this router has in flight
  (Envoy ``LEAST_REQUEST`` with all candidates compared), min-max over the candidates. Unlike
  ``running-requests-size-scorer`` it reads the router-local count, which is always fresh.
"""

from __future__ import annotations

import numpy as np

from slorouter.scheduling.plugin import Picker, Plugin, PluginContext, PluginParams, Scorer
from slorouter.scheduling.plugins.pickers import _CountedPicker
from slorouter.scheduling.plugins.scorers import min_max_inverted
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest


@register_plugin
class RoundRobinPicker(_CountedPicker, Picker):
    """The next candidates after the last one picked, in pool order, wrapping around."""

    type_name = "round-robin-picker"

    def __init__(self, name: str, params: PluginParams, ctx: PluginContext) -> None:
        super().__init__(name, params, ctx)
        self._last = -1  # pool position of the last endpoint picked

    def pick(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates, scores: np.ndarray
    ) -> np.ndarray:
        positions = candidates.positions
        n = len(positions)
        order = np.argsort(positions, kind="stable")
        start = int(np.searchsorted(positions[order], self._last, side="right")) % n
        chosen = order[(start + np.arange(min(self.max_endpoints, n))) % n]
        self._last = int(positions[chosen[0]])
        return chosen


@register_plugin
class LeastRequestScorer(Plugin, Scorer):
    """Prefers few router-local in-flight requests, min-max over the candidates."""

    type_name = "least-request-scorer"

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return min_max_inverted(candidates.column("inflight_requests"))
