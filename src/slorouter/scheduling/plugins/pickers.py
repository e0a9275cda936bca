"""Pickers (reference §2.3): choose target candidates from the total scores, best first.

``round-robin-picker`` is a load-balancer baseline that routers are compared with: endpoints in turn, in pool
order (Kubernetes Service / Envoy ``ROUND_ROBIN``); filtered-out or unhealthy endpoints are skipped, the
scores are ignored.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field, field_validator

from slorouter.scheduling.plugin import ListPicker, Picker, Plugin, PluginContext, PluginParams
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest


class PickerParams(PluginParams):
    max_num_of_endpoints: int = Field(1, alias="maxNumOfEndpoints")

    @field_validator("max_num_of_endpoints")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        return max(value, 1)  # as in the original: ≤ 0 means 1


class _CountedPicker(Plugin):
    Params = PickerParams
    params: PickerParams

    @property
    def max_endpoints(self) -> int:
        return self.params.max_num_of_endpoints


@register_plugin
class MaxScorePicker(_CountedPicker, ListPicker):
    """The highest total scores win; ties are broken uniformly at random (shuffle, then stable sort)."""

    type_name = "max-score-picker"

    def pick(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates, scores: np.ndarray
    ) -> np.ndarray:
        rng = self.ctx.rng
        if self.max_endpoints == 1:
            best = np.flatnonzero(scores == scores.max())
            return best[rng.integers(len(best), size=1)] if len(best) > 1 else best
        shuffled = rng.permutation(len(scores))
        order = shuffled[np.argsort(-scores[shuffled], kind="stable")]
        return order[: self.max_endpoints]

    def pick_list(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates, scores: list[float]
    ) -> list[int]:
        """``pick`` for scores without NaN (a profile's totals never hold NaN), drawing the same numbers."""
        rng = self.ctx.rng
        if self.max_endpoints == 1:
            top = max(scores)
            best = [i for i, s in enumerate(scores) if s == top]
            return [best[int(rng.integers(len(best), size=1)[0])]] if len(best) > 1 else best
        shuffled = rng.permutation(len(scores)).tolist()
        shuffled.sort(key=lambda i: -scores[i])  # stable, as argsort(kind="stable")
        return shuffled[: self.max_endpoints]


@register_plugin
class RandomPicker(_CountedPicker, Picker):
    """Uniformly random candidates, ignoring the scores."""

    type_name = "random-picker"

    def pick(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates, scores: np.ndarray
    ) -> np.ndarray:
        return uniform_pick(self.ctx.rng, len(scores), self.max_endpoints)


def uniform_pick(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    if k == 1:
        return np.array([rng.integers(n)])
    return rng.permutation(n)[:k]


@register_plugin
class WeightedRandomPicker(_CountedPicker, Picker):
    """Random candidates with probability proportional to their total score (A-Res reservoir sampling).

    Each candidate with score s > 0 draws U ~ Uniform(0, 1) and gets the key U^(1/s); the k largest keys
    win, so for k = 1 P(i) = s_i / Σ s. Keys are compared as log(U)/s, which orders them identically but does
    not underflow to ties for tiny scores. Candidates with s ≤ 0 are only chosen when fewer than k have
    s > 0; when none has, the pick is uniform.
    """

    type_name = "weighted-random-picker"

    def pick(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates, scores: np.ndarray
    ) -> np.ndarray:
        rng = self.ctx.rng
        k = self.max_endpoints
        positive = scores > 0
        if not positive.any():
            return uniform_pick(rng, len(scores), k)
        draws = rng.random(len(scores))
        draws[draws == 0.0] = 1e-10
        keys = np.full(len(scores), -np.inf)
        keys[positive] = np.log(draws[positive]) / scores[positive]
        if k == 1:
            return np.array([int(np.argmax(keys))])
        shuffled = rng.permutation(len(scores))  # random order among the zero-score candidates
        order = shuffled[np.argsort(-keys[shuffled], kind="stable")]
        return order[:k]


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
