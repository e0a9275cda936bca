"""In-flight load: the ``inflight-load-producer`` and the ``token-load-scorer`` that reads it.

The original producer estimates each request's tokens as prompt characters / 4 (× 2.5 with estimated output)
and keeps its own counters. Here the pool already keeps exact router-local counters (uncached prompt tokens
of requests not yet past their first token, context tokens of requests past it), so the producer reads those
columns instead.

The scorer follows llm-d's current token-aware definition ("Sticky Until Saturated", llm-d PR #1651): the
load of an endpoint is the uncached prefill tokens in flight there plus this request's own uncached prompt
on that endpoint; the score is ``1 − min(load, T)/T``.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from slorouter.scheduling.datakeys import (
    INFLIGHT_PREFILL_TOKENS,
    INFLIGHT_REQUESTS,
    INFLIGHT_TOKENS,
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_TOTAL_BLOCKS,
)
from slorouter.scheduling.plugin import DataProducer, ListScorer, Plugin, PluginParams
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.token_load import (
    DEFAULT_QUEUE_THRESHOLD_TOKENS,
    token_load_scores,
    uncached_prompt_tokens_list,
)
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest


@register_plugin(default_producer=True)
class InflightLoadProducer(Plugin, DataProducer):
    """Attaches each candidate's in-flight uncached prefill tokens, prefill + decode tokens and requests."""

    type_name = "inflight-load-producer"
    produces = (INFLIGHT_PREFILL_TOKENS, INFLIGHT_TOKENS, INFLIGHT_REQUESTS)

    def produce(self, request: InferenceRequest, candidates: Candidates) -> None:
        prefill = candidates.column("inflight_prefill_tokens")
        candidates.attrs[INFLIGHT_PREFILL_TOKENS] = prefill
        candidates.attrs[INFLIGHT_TOKENS] = prefill + candidates.column("inflight_decode_tokens")
        candidates.attrs[INFLIGHT_REQUESTS] = candidates.column("inflight_requests")


class TokenLoadParams(PluginParams):
    queue_threshold_tokens: int = Field(DEFAULT_QUEUE_THRESHOLD_TOKENS, alias="queueThresholdTokens", gt=0)
    # Add this request's own uncached prompt on each endpoint (``uncached_prompt_tokens``).
    count_request_tokens: bool = Field(True, alias="countRequestTokens")
    # Also count the context tokens (prompt + max_tokens) of requests past their first token, i.e. the whole
    # ``inflight_tokens``; llm-d's counterpart is the producer's ``addEstimatedOutputTokens`` (default false).
    count_decode_tokens: bool = Field(False, alias="countDecodeTokens")


@register_plugin
class TokenLoadScorer(Plugin, ListScorer):
    """1 − min(t, T)/T; t = uncached prefill tokens in flight + the request's uncached prompt on the endpoint.

    With ``countDecodeTokens`` the in-flight part also counts decode tokens; without ``countRequestTokens``
    the request's own part is left out (both together give the scorer before llm-d's change). Missing
    in-flight data counts as 0.
    """

    type_name = "token-load-scorer"
    Params = TokenLoadParams
    params: TokenLoadParams
    consumes = (
        INFLIGHT_PREFILL_TOKENS,
        INFLIGHT_TOKENS,
        PREFIX_MATCH_BLOCKS,
        PREFIX_TOTAL_BLOCKS,
        PREFIX_BLOCK_SIZE_TOKENS,
    )

    def _inflight(self, candidates: Candidates) -> np.ndarray | None:
        key = INFLIGHT_TOKENS if self.params.count_decode_tokens else INFLIGHT_PREFILL_TOKENS
        return candidates.attrs.get(key)

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return token_load_scores(
            request,
            candidates,
            self._inflight(candidates),
            count_request_tokens=self.params.count_request_tokens,
            threshold=float(self.params.queue_threshold_tokens),
        )

    def score_list(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> list[float]:
        inflight = self._inflight(candidates)
        loads: list[float] | None = None if inflight is None else [float(t) for t in inflight.tolist()]
        if self.params.count_request_tokens:
            own = uncached_prompt_tokens_list(request, candidates)
            loads = own if loads is None else [t + o for t, o in zip(loads, own, strict=True)]
        if loads is None:
            return [1.0] * len(candidates)
        threshold = float(self.params.queue_threshold_tokens)
        # np.clip is maximum then minimum, both keeping NaN (as Python's max/min do with NaN first).
        return [1.0 - min(max(t, 0.0), threshold) / threshold for t in loads]
