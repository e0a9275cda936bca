"""The pool's side of routing regret in the benchmark: what each engine's prefix cache really holds of a
prompt at the pick, so that policies without a prefix index (round-robin, least-request) are measured too,
and the router's view can be checked against it."""

from __future__ import annotations

from collections.abc import Sequence

from slorouter.sim.engine import Engine
from slorouter.tokenizer import BYTES_PER_TOKEN


def cached_prompt_tokens(engines: Sequence[Engine], prompt: bytes) -> list[int]:
    """Per engine, the prompt's leading tokens its prefix cache holds now (whole blocks; ``prompt``: packed
    token ids). Engines of one block size share the hash chain."""
    tokens = len(prompt) // BYTES_PER_TOKEN
    chains: dict[int, list[int]] = {}
    held = []
    for engine in engines:
        blocks = engine.kv_blocks
        chain = chains.get(blocks.block_size)
        if chain is None:
            chain = chains[blocks.block_size] = blocks.prompt_block_hashes(prompt)
        held.append(min(blocks.cached_prefix_blocks(chain) * blocks.block_size, tokens))
    return held
