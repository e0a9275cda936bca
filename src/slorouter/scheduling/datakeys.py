"""Names of the per-candidate data that producers attach to ``Candidates.attrs``.

Each name is both the ``attrs`` key and the data key that plugins list in ``produces``/``consumes``: the
loader uses it to auto-create missing producers and to order producers before their consumers.
"""

from __future__ import annotations

# approx-prefix-cache-producer: int64 arrays aligned with the candidates.
PREFIX_MATCH_BLOCKS = "prefix_match_blocks"  # leading blocks of the request's prompt the candidate holds
PREFIX_TOTAL_BLOCKS = "prefix_total_blocks"  # blocks the request's prompt hashed to (same for all candidates)
PREFIX_BLOCK_SIZE_TOKENS = "prefix_block_size_tokens"  # tokens per block used for this request
# precise-prefix-cache-producer writes the three above (per candidate: the pod's own block size and blocks)
# and this bool array: True where the match came from the pod's KV events, False where from the approximate
# index (the pod publishes no events).
PREFIX_MATCH_FROM_EVENTS = "prefix_match_from_events"

# inflight-load-producer: int64 arrays aligned with the candidates, from the router's own accounting.
INFLIGHT_TOKENS = "inflight_tokens"  # prefill + decode tokens of requests dispatched and not finished
# Uncached prompt tokens of requests not yet past their first token (llm-d's "uncached in-flight tokens").
INFLIGHT_PREFILL_TOKENS = "inflight_prefill_tokens"
INFLIGHT_REQUESTS = "inflight_requests"  # requests dispatched and not finished

# predicted-latency-producer: float64 / bool arrays aligned with the candidates. Written for every candidate
# or for none (when the predictor is not ready, unreachable or too slow), so consumers test for presence.
PREDICTED_TTFT_MS = "predicted_ttft_ms"  # predicted TTFT (E2E latency when streamingMode is false)
PREDICTED_TPOT_MS = "predicted_tpot_ms"  # predicted TPOT; 0 where it is not modelled
TTFT_HEADROOM_MS = "ttft_headroom_ms"  # SLO − prediction; −prediction without a TTFT SLO (see latency.py)
TPOT_HEADROOM_MS = "tpot_headroom_ms"
TTFT_VALID = "ttft_valid"  # predicted to meet the TTFT SLO
TPOT_VALID = "tpot_valid"  # predicted to meet the TPOT SLO

# load-latency-producer: float64, aligned with the candidates, for every candidate or for none (before its fit
# has samples): the TTFT it expects from the router's load counters and each pod's learned speed.
EXPECTED_TTFT_MS = "expected_ttft_ms"
# The compute time of this request's own uncached prefill on each candidate (ms): how long the decode streams
# running there would stall behind it.
OWN_PREFILL_MS = "own_prefill_ms"
# Each candidate's recent decode pace (ms per output token of its finished streams; NaN before its first).
DECODE_PACE_MS = "decode_pace_ms"
