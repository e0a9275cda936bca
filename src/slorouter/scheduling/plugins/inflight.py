"""In-flight load: the ``inflight-load-producer`` and the ``token-load-scorer`` that reads it.

The original producer estimates each request's tokens as prompt characters / 4 × 2.5 and keeps its own
counters. Here the pool already keeps exact router-local counters (prompt tokens of requests not yet past
their first token, context tokens of requests past it), so the producer reads those columns instead.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from slorouter.scheduling.datakeys import INFLIGHT_REQUESTS, INFLIGHT_TOKENS
from slorouter.scheduling.plugin import DataProducer, ListScorer, Plugin, PluginParams
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest


@register_plugin(default_producer=True)
class InflightLoadProducer(Plugin, DataProducer):
    """Attaches each candidate's in-flight tokens (prefill + decode) and requests from the router's counts."""

    type_name = "inflight-load-producer"
    produces = (INFLIGHT_TOKENS, INFLIGHT_REQUESTS)

    def produce(self, request: InferenceRequest, candidates: Candidates) -> None:
        candidates.attrs[INFLIGHT_TOKENS] = candidates.column("inflight_prefill_tokens") + candidates.column(
            "inflight_decode_tokens"
        )
        candidates.attrs[INFLIGHT_REQUESTS] = candidates.column("inflight_requests")


class TokenLoadParams(PluginParams):
    queue_threshold_tokens: int = Field(4_194_304, alias="queueThresholdTokens", gt=0)  # 128 requests × 32K


@register_plugin
class TokenLoadScorer(Plugin, ListScorer):
    """1 − min(t, T)/T for t in-flight tokens (t ≤ 0 → 1); T = queueThresholdTokens."""

    type_name = "token-load-scorer"
    Params = TokenLoadParams
    params: TokenLoadParams
    consumes = (INFLIGHT_TOKENS,)

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        tokens = candidates.attrs.get(INFLIGHT_TOKENS)
        if tokens is None:
            return np.ones(len(candidates))
        threshold = float(self.params.queue_threshold_tokens)
        return 1.0 - np.clip(tokens, 0, threshold) / threshold

    def score_list(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> list[float]:
        tokens = candidates.attrs.get(INFLIGHT_TOKENS)
        if tokens is None:
            return [1.0] * len(candidates)
        threshold = float(self.params.queue_threshold_tokens)
        # np.clip is maximum then minimum, both keeping NaN (as Python's max/min do with NaN first).
        return [1.0 - min(max(float(t), 0.0), threshold) / threshold for t in tokens.tolist()]
