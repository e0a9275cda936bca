"""Predicted-latency plugins that read the predictions (reference §3.3-3.7).

``predicted-latency-producer`` (in ``latency_producer.py``) writes per-candidate predictions, headroom and
validity into ``Candidates.attrs`` for every candidate or for none; these plugins consume them:

- ``prefix-cache-affinity-filter``: keep cache-warm candidates (epsilon-greedy, with a TTFT load gate on the
  predictions or, without them, on an in-flight-tokens throughput estimate);
- ``slo-headroom-tier-filter``: keep the tier predicted to meet the SLO (epsilon-greedy);
- ``latency-scorer``: score by headroom (or lowest predicted latency without an SLO), with a composite
  KV/queue/prefix fallback when there are no predictions;
- ``latency-slo-admitter``: shed sheddable requests that no candidate is predicted to serve within SLO.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from slorouter.scheduling.datakeys import (
    EXPECTED_TTFT_MS,
    INFLIGHT_PREFILL_TOKENS,
    PREDICTED_TTFT_MS,
    PREFIX_MATCH_BLOCKS,
    TPOT_HEADROOM_MS,
    TPOT_VALID,
    TTFT_HEADROOM_MS,
    TTFT_VALID,
)
from slorouter.scheduling.plugin import Admitter, Filter, Plugin, PluginParams, Scorer
from slorouter.scheduling.prefix_blocks import prefix_match_ratio
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import (
    DROPPED_REASON_HEADER,
    AdmissionDeniedError,
    Candidates,
    CycleState,
    InferenceRequest,
    PickReason,
    Route,
)

# A pod whose KV cache is this empty is "cold": its predictions are unreliable, and it can take load.
COLD_KV_USAGE = 0.02


# The TTFT load gate's sources (llm-d's ``ttftSource``; "peakPrefillThroughput" is the blog's name for llm-d's
# "prefillThroughput", accepted as a synonym) and its per-source penalty defaults: the original's 5,000 ms
# (llm-d keeps it with the latency predictor) and llm-d's 18,000 ms with the throughput estimate.
TTFT_SOURCE_AUTO: Literal["auto"] = "auto"
TTFT_SOURCE_PREDICTOR = "latencyPredictor"
TTFT_SOURCE_EXPECTED = "expectedLatency"  # load-latency-producer's expected TTFT
PREDICTOR_TTFT_PENALTY_MS = 5000.0
THROUGHPUT_TTFT_PENALTY_MS = 18000.0
PEAK_PREFILL_THROUGHPUT = 15928.0  # tok/s, llm-d's default: Qwen3-32B, 2× H100 (TP=2), one 8192-token chunk


class AffinityParams(PluginParams):
    affinity_threshold: float = Field(0.80, alias="affinityThreshold", le=1.0)
    exploration_probability: float = Field(0.01, alias="explorationProbability", ge=0.0, le=1.0)
    # None: PREDICTOR_TTFT_PENALTY_MS when the gate compares predictions, THROUGHPUT_TTFT_PENALTY_MS when it
    # compares throughput estimates. 0 disables the gate.
    max_ttft_penalty_ms: float | None = Field(None, alias="maxTTFTPenaltyMs", ge=0.0)
    ttft_source: Literal[
        "auto", "latencyPredictor", "expectedLatency", "prefillThroughput", "peakPrefillThroughput"
    ] = Field(TTFT_SOURCE_AUTO, alias="ttftSource")
    peak_prefill_throughput: float = Field(
        PEAK_PREFILL_THROUGHPUT, alias="peakPrefillThroughput", gt=0.0, allow_inf_nan=False
    )


@register_plugin
class PrefixCacheAffinityFilter(Plugin, Filter):
    """Narrows the candidates to cache-warm ones (prefix match ≥ ``affinityThreshold``).

    With probability ``explorationProbability`` the filter steps aside (cold pods get cache entries seeded).
    The TTFT load gate keeps every candidate when the best warm pod's TTFT is worse than the best cold pod's
    by more than ``maxTTFTPenaltyMs`` (0 disables the gate). TTFTs come from ``ttftSource``: the predictions
    (``latencyPredictor``), or in-flight uncached prefill tokens / ``peakPrefillThroughput``
    (``prefillThroughput``); ``auto`` uses the predictions when there are some, else the estimate. Without
    its signal the gate is inert. A threshold ≤ 0 disables the filter.
    """

    type_name = "prefix-cache-affinity-filter"
    Params = AffinityParams
    params: AffinityParams
    consumes = (PREFIX_MATCH_BLOCKS, INFLIGHT_PREFILL_TOKENS)

    def gate_ttft_ms(self, candidates: Candidates) -> tuple[np.ndarray, float] | None:
        """Per-candidate TTFT (ms) the load gate compares and its penalty (ms); None without a signal."""
        p = self.params
        if p.ttft_source == TTFT_SOURCE_EXPECTED:
            expected = candidates.attrs.get(EXPECTED_TTFT_MS)
            if expected is None:  # the load model is not ready: llm-d's throughput estimate at its 18 s
                return self._throughput_gate(candidates, THROUGHPUT_TTFT_PENALTY_MS)
            penalty = p.max_ttft_penalty_ms
            return expected, PREDICTOR_TTFT_PENALTY_MS if penalty is None else penalty
        if p.ttft_source in (TTFT_SOURCE_AUTO, TTFT_SOURCE_PREDICTOR):
            predicted = candidates.attrs.get(PREDICTED_TTFT_MS)
            if predicted is not None:
                penalty = p.max_ttft_penalty_ms
                return predicted, PREDICTOR_TTFT_PENALTY_MS if penalty is None else penalty
            if p.ttft_source == TTFT_SOURCE_PREDICTOR:
                return None
        penalty = THROUGHPUT_TTFT_PENALTY_MS if p.max_ttft_penalty_ms is None else p.max_ttft_penalty_ms
        return self._throughput_gate(candidates, penalty)

    def _throughput_gate(self, candidates: Candidates, penalty_ms: float) -> tuple[np.ndarray, float] | None:
        tokens = candidates.attrs.get(INFLIGHT_PREFILL_TOKENS)
        if tokens is None:
            return None
        return tokens / self.params.peak_prefill_throughput * 1000.0, penalty_ms

    def filter(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> Candidates:
        p = self.params
        if len(candidates) <= 1 or p.affinity_threshold <= 0:
            return candidates
        if p.exploration_probability > 0 and self.ctx.rng.random() < p.exploration_probability:
            cycle.explored = True
            return candidates
        sticky = prefix_match_ratio(candidates) >= p.affinity_threshold
        if not sticky.any():
            return candidates
        if p.max_ttft_penalty_ms != 0 and not sticky.all():
            gate = self.gate_ttft_ms(candidates)
            if gate is not None:
                ttft_ms, penalty_ms = gate
                if ttft_ms[sticky].min() - ttft_ms[~sticky].min() > penalty_ms:
                    cycle.reason = PickReason.LOAD_GATE
                    return candidates
        if sticky.all():
            return candidates
        cycle.reason = PickReason.AFFINITY
        return candidates.subset(sticky)


class LatencyBandParams(PluginParams):
    relative_band: float = Field(0.25, alias="relativeBand", ge=0.0)
    absolute_band_ms: float = Field(10.0, alias="absoluteBandMs", ge=0.0)


@register_plugin
class LatencyBandFilter(Plugin, Filter):
    """Keeps the candidates whose predicted TTFT is within a band of the best one's: those the predictor
    cannot tell apart from the best, given its error. The profile's other scorers then choose among them, so
    a prediction only overrides them where it is confidently worse (a slower pod, a long queue).

    Kept: predicted TTFT ≤ min · (1 + ``relativeBand``) + ``absoluteBandMs``. Without predictions it keeps
    everything and sets the route to fallback.
    """

    type_name = "latency-band-filter"
    Params = LatencyBandParams
    params: LatencyBandParams

    def filter(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> Candidates:
        predicted = candidates.attrs.get(PREDICTED_TTFT_MS)
        if predicted is None:
            cycle.route = Route.FALLBACK
            return candidates
        cycle.route = Route.EXPLORE if cycle.explored else Route.PREDICTED
        if len(candidates) <= 1:
            return candidates
        p = self.params
        limit = predicted.min() * (1.0 + p.relative_band) + p.absolute_band_ms
        keep = predicted <= limit
        if keep.all():
            return candidates
        cycle.reason = PickReason.LATENCY_BAND
        return candidates.subset(keep)


TierDimension = Literal["ttft", "tpot"]
BOTH_DIMENSIONS: tuple[TierDimension, ...] = ("ttft", "tpot")


class TierParams(PluginParams):
    epsilon_explore_neg: float = Field(0.01, alias="epsilonExploreNeg", ge=0.0, le=1.0)
    dimensions: list[TierDimension] = Field(default_factory=lambda: list(BOTH_DIMENSIONS), min_length=1)

    @field_validator("dimensions")
    @classmethod
    def _distinct(cls, value: list[TierDimension]) -> list[TierDimension]:
        if len(set(value)) != len(value):
            raise ValueError(f"dimensions must not repeat a dimension, got {value}")
        return value


@register_plugin
class SloHeadroomTierFilter(Plugin, Filter):
    """Keeps the candidates predicted to meet the SLO (headroom ≥ 0 on each of ``dimensions``, both TTFT and
    TPOT by default as in llm-d) when some do and some do not; with probability ``epsilonExploreNeg`` it keeps
    the others instead, so their predictions keep being tested. Without predictions, or when every candidate
    is in one tier, it keeps everything. With predictions it marks the route ``predicted`` (``explore`` after
    an exploration)."""

    type_name = "slo-headroom-tier-filter"
    Params = TierParams
    params: TierParams

    def filter(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> Candidates:
        ttft_headroom = candidates.attrs.get(TTFT_HEADROOM_MS)
        if ttft_headroom is None:
            return candidates
        # The predictions decided which pods may serve the request: the pick is a predicted one even when
        # the profile's scorer then ranks by load.
        cycle.route = Route.EXPLORE if cycle.explored else Route.PREDICTED
        if len(candidates) <= 1:
            return candidates
        dimensions = self.params.dimensions
        if "ttft" in dimensions:
            positive = ttft_headroom >= 0
            if "tpot" in dimensions:
                positive &= candidates.attrs[TPOT_HEADROOM_MS] >= 0
        else:
            positive = candidates.attrs[TPOT_HEADROOM_MS] >= 0
        if positive.all() or not positive.any():
            return candidates
        eps = self.params.epsilon_explore_neg
        if eps > 0 and self.ctx.rng.random() < eps:
            cycle.explored = True
            cycle.route = Route.EXPLORE
            return candidates.subset(~positive)
        cycle.reason = PickReason.SLO_TIER
        return candidates.subset(positive)


class LatencyScorerParams(PluginParams):
    ttft_weight: float = Field(0.8, alias="ttftWeight", ge=0.0)
    tpot_weight: float = Field(0.2, alias="tpotWeight", ge=0.0)
    headroom_selection_strategy: Literal["least", "most"] = Field("least", alias="headroomSelectionStrategy")
    composite_kv_weight: float = Field(1.0, alias="compositeKVWeight", ge=0.0)
    composite_queue_weight: float = Field(1.0, alias="compositeQueueWeight", ge=0.0)
    composite_prefix_weight: float = Field(1.0, alias="compositePrefixWeight", ge=0.0)


_EPS = 1e-9


def _normalised(values: np.ndarray) -> tuple[np.ndarray, bool]:
    """(v − min)/(max − min), or 0.5 everywhere when the values are (nearly) equal; and whether they vary."""
    low, high = values.min(), values.max()
    if high - low <= _EPS:
        return np.full(len(values), 0.5), False
    return (values - low) / (high - low), True


def headroom_bucket_scores(
    ttft_headroom: np.ndarray,
    tpot_headroom: np.ndarray,
    *,
    ttft_weight: float,
    tpot_weight: float,
    strategy: Literal["least", "most"],
) -> np.ndarray:
    """Scores in [0.01, 1.01] for one bucket of candidates (reference §3.5 ``scoreBucket``).

    On |headroom|, min-max normalised within the bucket and blended α·TTFT + β·TPOT (weights normalised;
    a dimension that does not vary hands its weight to the other). ``least`` favours the smallest |headroom|
    (closest fit to the SLO, or the smallest deficit), ``most`` the largest.
    """
    total = ttft_weight + tpot_weight
    alpha, beta = (ttft_weight / total, tpot_weight / total) if total > 0 else (1.0, 0.0)
    n_ttft, ttft_varies = _normalised(np.abs(ttft_headroom))
    n_tpot, tpot_varies = _normalised(np.abs(tpot_headroom))
    if tpot_varies and not ttft_varies:
        alpha, beta = 0.0, 1.0
    elif ttft_varies and not tpot_varies:
        alpha, beta = 1.0, 0.0
    combined = alpha * n_ttft + beta * n_tpot
    if strategy == "least":
        combined = 1.0 - combined
    # The original's integer buckets: floor(c·100)+1 over 100. Kept for identical tie behaviour.
    return (np.floor(combined * 100.0 + 1e-9) + 1.0) / 100.0


def composite_scores(
    candidates: Candidates, kv_weight: float, queue_weight: float, prefix_weight: float
) -> np.ndarray:
    """The fallback without predictions: a blend of free KV cache, relative queue depth and prefix match."""
    total = kv_weight + queue_weight + prefix_weight
    wkv, wq, wp = (kv_weight / total, queue_weight / total, prefix_weight / total) if total > 0 else (1, 0, 0)
    waiting = candidates.column("waiting").astype(np.float64)
    max_waiting = waiting.max()
    relative_queue = (max_waiting - waiting) / max_waiting if max_waiting > 0 else np.ones(len(waiting))
    kv_free = 1.0 - candidates.column("kv_usage")
    blended = wkv * kv_free + wq * relative_queue + wp * prefix_match_ratio(candidates)
    return np.round(blended * 100.0) / 100.0


@register_plugin
class LatencyScorer(Plugin, Scorer):
    """Scores by predicted latency (reference §3.5), or by the composite fallback without predictions.

    Candidates predicted to meet the SLO are scored by headroom with ``headroomSelectionStrategy``
    (``least``: bin-packing, ``most``: spreading); the others score 0. When none meets it: idle candidates
    first (no request in flight from this router), else the first non-empty deficit bucket — TPOT-only
    misses, TTFT-only misses, both — scored by smallest deficit. Without an SLO every candidate "misses" by
    its prediction, so the lowest predicted latency wins.
    """

    type_name = "latency-scorer"
    Params = LatencyScorerParams
    params: LatencyScorerParams
    consumes = (PREFIX_MATCH_BLOCKS,)

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        p = self.params
        ttft_headroom = candidates.attrs.get(TTFT_HEADROOM_MS)
        if ttft_headroom is None:
            cycle.route = Route.FALLBACK
            return composite_scores(
                candidates, p.composite_kv_weight, p.composite_queue_weight, p.composite_prefix_weight
            )
        cycle.route = Route.EXPLORE if cycle.explored else Route.PREDICTED
        tpot_headroom = candidates.attrs[TPOT_HEADROOM_MS]
        ttft_miss = ttft_headroom < 0
        tpot_miss = tpot_headroom < 0
        positive = ~(ttft_miss | tpot_miss)
        if positive.any():
            return self._bucket(positive, ttft_headroom, tpot_headroom, p.headroom_selection_strategy)
        idle = candidates.column("inflight_requests") == 0
        if idle.any():
            return self._bucket(idle, ttft_headroom, tpot_headroom, "least")
        for bucket in (~ttft_miss & tpot_miss, ttft_miss & ~tpot_miss, ttft_miss & tpot_miss):
            if bucket.any():
                return self._bucket(bucket, ttft_headroom, tpot_headroom, "least")
        raise AssertionError("the deficit buckets cover every candidate")

    def _bucket(
        self,
        mask: np.ndarray,
        ttft_headroom: np.ndarray,
        tpot_headroom: np.ndarray,
        strategy: Literal["least", "most"],
    ) -> np.ndarray:
        scores = np.zeros(len(mask))
        scores[mask] = headroom_bucket_scores(
            ttft_headroom[mask],
            tpot_headroom[mask],
            ttft_weight=self.params.ttft_weight,
            tpot_weight=self.params.tpot_weight,
            strategy=strategy,
        )
        return scores


@register_plugin
class LatencySloAdmitter(Plugin, Admitter):
    """Sheds sheddable requests (priority < 0) with an SLO when no candidate is predicted to meet it.

    A candidate counts as able when it is predicted valid on both dimensions, idle (neither the model server
    nor this router has a request running on it) or cold (KV cache under 2% used, where predictions are
    least reliable). Without predictions it admits (fail open). A rejection is HTTP 429 with
    ``x-slorouter-dropped-reason: slo-unattainable`` (the original answers 500).
    """

    type_name = "latency-slo-admitter"

    def admit(self, request: InferenceRequest, candidates: Candidates) -> None:
        if not request.sheddable or not request.has_slo:
            return
        ttft_valid = candidates.attrs.get(TTFT_VALID)
        if ttft_valid is None:
            return
        able = ttft_valid & candidates.attrs[TPOT_VALID]
        able |= (candidates.column("running") == 0) & (candidates.column("inflight_requests") == 0)
        able |= candidates.column("kv_usage") < COLD_KV_USAGE
        if not able.any():
            raise AdmissionDeniedError(
                "no endpoint is predicted to meet the request's latency SLO; sheddable request dropped",
                headers={"Retry-After": "1", DROPPED_REASON_HEADER: "slo-unattainable"},
            )
