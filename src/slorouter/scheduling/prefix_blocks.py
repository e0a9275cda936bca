"""The prompt's block-hash chain and the prefix match it gives, shared by every plugin and framework part that
hashes prompts (the approximate and precise prefix producers, the affinity filter, the load scorers, the
traffic recorder).

The chain: h_i = xxhash64(block_i ‖ little-endian uint64(h_{i−1})), h_{−1} = xxhash64(model ‖ cache salt),
over UTF-8 blocks of ``block tokens × CHARS_PER_TOKEN`` bytes. The match of a candidate is what
``approx-prefix-cache-producer`` (or the precise one) attached: ``PREFIX_MATCH_BLOCKS`` of
``PREFIX_TOTAL_BLOCKS``.
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash

from slorouter.scheduling.datakeys import PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS
from slorouter.scheduling.types import Candidates

CHARS_PER_TOKEN = 4  # the original's fixed estimate; "characters" are UTF-8 bytes, as in Go strings

_hash64 = xxhash.xxh64_intdigest
_pack_u64 = struct.Struct("<Q").pack


def utf8_bytes(text: str) -> bytes:
    """``text`` in UTF-8; a lone surrogate (JSON lets a client send ``"\\ud800"``) as ``surrogatepass``
    writes it, as the tokenizer counts it, so that such a prompt is hashed rather than failing the plugin."""
    return text.encode("utf-8", "surrogatepass")


def prefix_seed(model: str, cache_salt: str = "") -> int:
    """xxhash64 of the target model name followed by the cache salt: the chain's starting value."""
    return _hash64(utf8_bytes(model + cache_salt))


def prefix_block_hashes(data: bytes, seed: int, block_chars: int, max_blocks: int) -> list[int]:
    """Chained block hashes: h_i = xxhash64(block_i ‖ little-endian uint64(h_{i−1})), h_{−1} = seed.

    Input shorter than one block gives no hashes. Input beyond ``max_blocks`` blocks is ignored; otherwise a
    trailing partial block is hashed like a full one.
    """
    if len(data) < block_chars:
        return []
    return chain_hashes(data, seed, block_chars, max_blocks)


def chain_hashes(data: bytes, previous: int, block_chars: int, max_blocks: int) -> list[int]:
    """The chain over ``data`` (at most ``max_blocks`` blocks, a trailing partial one included) after
    ``previous``."""
    if max_blocks <= 0:
        return []
    limit = max_blocks * block_chars
    if len(data) > limit:
        data = data[:limit]
    hashes: list[int] = []
    append = hashes.append
    # The chain is sequential; plain slicing and concatenation measured faster than a reused buffer or a
    # streaming hasher for 64-byte blocks.
    for start in range(0, len(data), block_chars):
        previous = _hash64(data[start : start + block_chars] + _pack_u64(previous))
        append(previous)
    return hashes


def prefix_match_ratio(candidates: Candidates) -> np.ndarray:
    """matched / total prefix blocks per candidate; 0 where the producer's data is missing or total is 0."""
    matched = candidates.attrs.get(PREFIX_MATCH_BLOCKS)
    total = candidates.attrs.get(PREFIX_TOTAL_BLOCKS)
    if matched is None or total is None:
        return np.zeros(len(candidates))
    return matched / np.maximum(total, 1)  # matched ≤ total, so total 0 gives 0


def prefix_match_ratio_list(candidates: Candidates) -> list[float]:
    """``prefix_match_ratio`` in plain Python (the same float64 division, so the same results)."""
    matched = candidates.attrs.get(PREFIX_MATCH_BLOCKS)
    total = candidates.attrs.get(PREFIX_TOTAL_BLOCKS)
    if matched is None or total is None:
        return [0.0] * len(candidates)
    # np.maximum(t, 1) keeps NaN; numpy divides the operands as float64.
    return [
        float(m) / float(t if t >= 1 or t != t else 1)
        for m, t in zip(matched.tolist(), total.tolist(), strict=True)
    ]
