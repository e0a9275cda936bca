"""``expected-latency-scorer``: ranks candidates by the expected TTFT the producer attached, plus the charges
for stalled decode streams and the request's own decode (both opt-in weights)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from slorouter.scheduling.datakeys import (
    DECODE_PACE_MS,
    EXPECTED_TTFT_MS,
    INFLIGHT_PREFILL_TOKENS,
    OWN_PREFILL_MS,
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_TOTAL_BLOCKS,
)
from slorouter.scheduling.plugin import (
    Plugin,
    PluginParams,
    Scorer,
)
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.token_load import token_load_scores
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest, Route


class ExpectedLatencyScorerParams(PluginParams):
    max_latency_ms: float = Field(60_000.0, alias="maxLatencyMs", gt=0.0, allow_inf_nan=False)
    interference_weight: float = Field(0.0, alias="interferenceWeight", ge=0.0, allow_inf_nan=False)
    decode_weight: float = Field(0.0, alias="decodeWeight", ge=0.0, allow_inf_nan=False)
    max_decode_tokens: int = Field(1024, alias="maxDecodeTokens", ge=1)


@register_plugin
class ExpectedLatencyScorer(Plugin, Scorer):
    """``1 − min(cost, T)/T``, cost = expected TTFT + ``interferenceWeight`` · decoding requests · own
    prefill ms + ``decodeWeight`` · min(max_tokens, ``maxDecodeTokens``) · (pod's decode pace − the fastest
    candidate's) (``T`` = ``maxLatencyMs``). Without expected TTFTs it scores the token load exactly as
    ``token-load-scorer`` does (in-flight uncached prefill + the request's own uncached prompt).

    The interference term is what the request's prefill costs the others: every decode stream running on
    the pod waits for the prefill chunks in its steps, so a pod's cost grows with the streams it would
    stall. 1 counts a millisecond of someone else's stall as much as one of this request's first token (the
    least total latency); 0 routes by this request's TTFT alone.

    The decode term is what the request's own reply would cost there beyond the fastest candidate: its
    tokens (``max_tokens``, capped: a client's ceiling, not a length) times how much slower the pod has
    been decoding lately. It is the only term that sees a pod's decode batch and GPU class through its
    TPOT; without it the TTFT terms pile requests on the pods that answer first, whose batches then grow.
    Pods with no pace yet are charged nothing (so they are tried and measured).
    """

    type_name = "expected-latency-scorer"
    Params = ExpectedLatencyScorerParams
    params: ExpectedLatencyScorerParams
    consumes = (
        EXPECTED_TTFT_MS,
        DECODE_PACE_MS,
        INFLIGHT_PREFILL_TOKENS,
        PREFIX_MATCH_BLOCKS,
        PREFIX_TOTAL_BLOCKS,
        PREFIX_BLOCK_SIZE_TOKENS,
    )

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        expected = candidates.attrs.get(EXPECTED_TTFT_MS)
        if expected is None:
            return token_load_scores(request, candidates, candidates.attrs.get(INFLIGHT_PREFILL_TOKENS))
        cycle.route = Route.EXPLORE if cycle.explored else Route.PREDICTED
        cost = expected
        weight = self.params.interference_weight
        if weight > 0:
            decoding = candidates.column("inflight_decoding")
            cost = cost + weight * decoding * candidates.attrs[OWN_PREFILL_MS]
        if self.params.decode_weight > 0:
            cost = cost + self._decode_cost(request, candidates.attrs.get(DECODE_PACE_MS))
        cap = self.params.max_latency_ms
        return 1.0 - np.clip(cost, 0.0, cap) / cap

    def _decode_cost(self, request: InferenceRequest, pace: np.ndarray | None) -> np.ndarray | float:
        if pace is None:
            return 0.0
        known = np.isfinite(pace)
        if not known.any():
            return 0.0
        slower = np.where(known, pace - pace[known].min(), 0.0)
        tokens = min(request.max_tokens, self.params.max_decode_tokens)
        return (self.params.decode_weight * tokens) * slower
