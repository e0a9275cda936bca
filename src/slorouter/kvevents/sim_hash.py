"""The simulated engine's block hash chain, which the router recomputes to match a pod's KV events.

Block ``i`` of a sequence hashes to ``h_i = xxh3_64(token bytes of block i, seed=h_{i-1})`` with
``h_{-1} = ROOT_HASH``; a block's bytes are its ``block_size`` token ids as packed little-endian uint32
(``slorouter.tokenizer``: 4 bytes of UTF-8 text per token). Only full blocks are hashed. Like vLLM's
``hash_block_tokens`` (sha256 or xxhash over parent hash, token ids and extra keys, rooted at ``NONE_HASH``
from ``PYTHONHASHSEED``), the chain makes a block's hash name its whole prefix; unlike vLLM's it has no
per-process seed and no extra keys (LoRA, multimodal, cache salt), so any process computes the same hashes.
"""

from __future__ import annotations

import xxhash

from slorouter.tokenizer import BYTES_PER_TOKEN

ROOT_HASH = 0x5EED_0F_B10C  # parent of a sequence's first block


def block_hashes(token_bytes: bytes, block_size: int, max_blocks: int = 0) -> list[int]:
    """The chain over the full blocks of ``token_bytes`` (at most ``max_blocks`` of them when > 0)."""
    stride = block_size * BYTES_PER_TOKEN
    end = len(token_bytes) - stride + 1
    if max_blocks > 0:
        end = min(end, max_blocks * stride)
    hashes: list[int] = []
    parent = ROOT_HASH
    digest = xxhash.xxh3_64_intdigest
    for offset in range(0, end, stride):
        parent = digest(token_bytes[offset : offset + stride], parent)
        hashes.append(parent)
    return hashes
