"""The KV-block manager on its own: allocation order, LRU eviction, prefix lookups and the block hashes."""

from __future__ import annotations

from slorouter.sim.kv_cache import KVBlockManager, KVSequence
from slorouter.sim.text import output_bytes
from slorouter.tokenizer import token_ids_to_bytes

BLOCK = 4


def sequence(kv: KVBlockManager, tokens: list[int] | bytes) -> KVSequence:
    prompt = tokens if isinstance(tokens, bytes) else token_ids_to_bytes(tokens)
    return KVSequence(prompt, kv.prompt_block_hashes(prompt))


def admitted(kv: KVBlockManager, tokens: list[int] | bytes, new_blocks: int | None = None) -> KVSequence:
    """A sequence given its cached prefix and blocks for all its prompt, every full block cached."""
    seq = sequence(kv, tokens)
    hits = kv.lookup_prefix(seq, seq.prompt_len)
    needed = -(-seq.prompt_len // BLOCK) - len(hits) if new_blocks is None else new_blocks
    assert kv.can_admit(hits, needed)
    kv.admit(seq, hits, needed)
    kv.cache_full_blocks(seq, seq.prompt_len)
    return seq


def test_fresh_blocks_first_in_id_order_then_the_least_recently_freed_tail_first():
    kv = KVBlockManager(6, BLOCK)
    a = admitted(kv, list(range(8)))  # 2 blocks
    b = admitted(kv, list(range(100, 112)))  # 3 blocks
    assert (a.blocks, b.blocks, kv.num_free_blocks) == ([0, 1], [2, 3, 4], 1)
    kv.free(b)
    kv.free(a)
    assert kv.num_free_blocks == 6
    c = admitted(kv, list(range(200, 224)))  # 6 blocks: the fresh one, then b's tail first, then a's
    assert c.blocks == [5, 4, 3, 2, 1, 0]
    assert kv.num_free_blocks == 0


def test_a_prefix_hit_shares_blocks_and_never_covers_the_last_token():
    kv = KVBlockManager(16, BLOCK)
    first = admitted(kv, list(range(12)))
    again = sequence(kv, list(range(12)))
    assert kv.lookup_prefix(again, 12) == first.blocks[:2]  # 11 tokens at most: two full blocks
    longer = sequence(kv, [*range(12), 99])
    assert kv.lookup_prefix(longer, 13) == first.blocks
    other = sequence(kv, [7, *range(1, 12)])
    assert kv.lookup_prefix(other, 12) == []  # the chain breaks at the first block


def test_cached_blocks_nobody_references_count_as_free_and_are_revived_by_admission():
    kv = KVBlockManager(4, BLOCK)
    first = admitted(kv, list(range(12)))
    blocks = first.blocks
    kv.free(first)
    assert kv.num_free_blocks == 4 and first.blocks == []
    seq = sequence(kv, [*range(12), 5])
    hits = kv.lookup_prefix(seq, 13)
    assert len(hits) == 3
    assert kv.can_admit(hits, 1) and not kv.can_admit(hits, 2)  # the 3 revived blocks leave the free queue
    kv.admit(seq, hits, 1)
    assert seq.blocks == [*blocks, 3] and kv.num_free_blocks == 0


def test_an_eviction_invalidates_a_remembered_lookup():
    kv = KVBlockManager(4, BLOCK)
    cached = admitted(kv, list(range(8)))
    blocks = cached.blocks
    kv.free(cached)
    waiting = sequence(kv, [*range(8), 1, 2, 3])
    assert kv.lookup_prefix(waiting, 11) == blocks == [0, 1]
    assert waiting.hit_blocks == blocks
    admitted(kv, list(range(50, 62)))  # 3 blocks: the fresh ones, then block 1 evicted (LRU: tail first)
    assert kv.lookup_prefix(waiting, 11) == [0]


def test_blocks_of_generated_tokens_hash_like_the_same_tokens_in_a_prompt():
    kv = KVBlockManager(32, BLOCK)
    prompt = token_ids_to_bytes(list(range(6)))
    seq = admitted(kv, prompt)
    # Ten tokens generated, one block at a time as while decoding (the fast path), then the rest at once.
    for computed in range(7, 17):
        if computed > len(seq.blocks) * BLOCK:
            kv.append_block(seq)
        kv.cache_full_blocks(seq, computed)
    assert len(seq.block_hashes) == 4
    next_turn = sequence(kv, prompt + output_bytes(0, 10) + token_ids_to_bytes([1, 2, 3]))
    assert next_turn.block_hashes[:4] == seq.block_hashes
    assert kv.lookup_prefix(next_turn, next_turn.prompt_len) == seq.blocks[:4]
