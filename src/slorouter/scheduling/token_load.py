"""The token-aware load core (llm-d's "Sticky Until Saturated"): the prompt tokens a request would have to
prefill on each candidate, and the token-load score ``1 − min(t, T)/T`` over them. ``token-load-scorer``
ranks by it; the affinity filter's throughput gate and the load-latency producer count the same tokens.
"""

from __future__ import annotations

import numpy as np

from slorouter.scheduling.datakeys import PREFIX_BLOCK_SIZE_TOKENS, PREFIX_MATCH_BLOCKS
from slorouter.scheduling.prefix_blocks import prefix_match_ratio, prefix_match_ratio_list
from slorouter.scheduling.types import Candidates, InferenceRequest


def uncached_prompt_tokens(request: InferenceRequest, candidates: Candidates) -> np.ndarray:
    """The request's prompt tokens each candidate would have to prefill (llm-d's ``UncachedRequestTokens``).

    ``prompt − min(matched blocks × block size, prompt)``: a prompt longer than the indexed blocks keeps its
    tail uncached. Without the block size, ``prompt × (1 − matched/total)``; without prefix data, the prompt.
    """
    prompt = float(request.prompt_tokens)
    matched = candidates.attrs.get(PREFIX_MATCH_BLOCKS)
    block_size = candidates.attrs.get(PREFIX_BLOCK_SIZE_TOKENS)
    if matched is None or block_size is None:
        return prompt * (1.0 - prefix_match_ratio(candidates))
    cached = np.asarray(matched, dtype=np.float64) * np.asarray(block_size, dtype=np.float64)
    return prompt - np.minimum(cached, prompt)


def uncached_prompt_tokens_list(request: InferenceRequest, candidates: Candidates) -> list[float]:
    """``uncached_prompt_tokens`` in plain Python (the same float64 operations, so the same results)."""
    prompt = float(request.prompt_tokens)
    matched = candidates.attrs.get(PREFIX_MATCH_BLOCKS)
    block_size = candidates.attrs.get(PREFIX_BLOCK_SIZE_TOKENS)
    if matched is None or block_size is None:
        return [prompt * (1.0 - r) for r in prefix_match_ratio_list(candidates)]
    # np.minimum keeps NaN from either side; min(x, prompt) keeps it from x (prompt is never NaN).
    return [
        prompt - min(float(m) * float(b), prompt)
        for m, b in zip(matched.tolist(), block_size.tolist(), strict=True)
    ]


DEFAULT_QUEUE_THRESHOLD_TOKENS = 4_194_304  # 128 requests × 32K


def token_load_scores(
    request: InferenceRequest,
    candidates: Candidates,
    inflight: np.ndarray | None,
    *,
    count_request_tokens: bool = True,
    threshold: float = float(DEFAULT_QUEUE_THRESHOLD_TOKENS),
) -> np.ndarray:
    """``1 − min(t, T)/T`` per candidate, t = ``inflight`` (None: 0) + the request's own uncached prompt
    there; the token-load scorer's formula, also the expected-latency scorer's fallback."""
    load = inflight
    if count_request_tokens:
        own = uncached_prompt_tokens(request, candidates)
        load = own if load is None else load + own
    if load is None:
        return np.ones(len(candidates))
    return 1.0 - np.clip(load, 0, threshold) / threshold
