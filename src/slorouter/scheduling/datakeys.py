"""Names of the per-candidate data that producers attach to ``Candidates.attrs``.

Each name is both the ``attrs`` key and the data key that plugins list in ``produces``/``consumes``: the
loader uses it to auto-create missing producers and to order producers before their consumers.
"""

from __future__ import annotations

# approx-prefix-cache-producer: int64 arrays aligned with the candidates.
PREFIX_MATCH_BLOCKS = "prefix_match_blocks"  # leading blocks of the request's prompt the candidate holds
PREFIX_TOTAL_BLOCKS = "prefix_total_blocks"  # blocks the request's prompt hashed to (same for all candidates)
PREFIX_BLOCK_SIZE_TOKENS = "prefix_block_size_tokens"  # tokens per block used for this request

# inflight-load-producer: int64 arrays aligned with the candidates, from the router's own accounting.
INFLIGHT_TOKENS = "inflight_tokens"  # prompt + context tokens of requests dispatched and not finished
INFLIGHT_REQUESTS = "inflight_requests"  # requests dispatched and not finished
