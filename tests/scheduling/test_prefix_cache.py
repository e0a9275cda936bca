"""Approximate prefix cache (reference §2.4): the hash chain, the index, the producer and its wiring."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash

from slorouter.scheduling.datakeys import PREFIX_BLOCK_SIZE_TOKENS, PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS
from slorouter.scheduling.plugins.prefix.approx import (
    PrefixRequestState,
)
from slorouter.scheduling.plugins.prefix.index import PrefixIndex
from slorouter.scheduling.prefix_blocks import prefix_block_hashes, prefix_match_ratio, prefix_seed
from tests.helpers.scheduling import (
    addresses,
    candidates_of,
    make_director,
    make_pool,
    make_request,
    producer,
    result_for,
    serve,
)


def xxh(data: bytes) -> int:
    return xxhash.xxh64_intdigest(data)


def le64(value: int) -> bytes:
    return struct.pack("<Q", value)


# --- hashing -------------------------------------------------------------------------------------------


def test_seed_is_xxhash64_of_model_then_salt():
    assert prefix_seed("llama") == xxh(b"llama")
    assert prefix_seed("llama", "tenant-7") == xxh(b"llamatenant-7")


def test_chain_with_partial_tail():
    data = b"a" * 64 + b"b" * 64 + b"c" * 10
    seed = prefix_seed("m")
    h0 = xxh(b"a" * 64 + le64(seed))
    h1 = xxh(b"b" * 64 + le64(h0))
    h2 = xxh(b"c" * 10 + le64(h1))
    assert prefix_block_hashes(data, seed, 64, 256) == [h0, h1, h2]


def test_golden_values():
    # Pins the exact chain (seed, block split, byte order, tail) against accidental change.
    data = b"The quick brown fox jumps over the lazy dog. " * 3  # 135 bytes: two full blocks and a tail
    assert prefix_block_hashes(data, prefix_seed("m"), 64, 256) == [
        2177202908224740038,
        2512475064907297494,
        6278238565362763968,
    ]


def test_shorter_than_one_block_gives_no_hashes():
    assert prefix_block_hashes(b"x" * 63, 0, 64, 256) == []
    assert len(prefix_block_hashes(b"x" * 64, 0, 64, 256)) == 1
    assert len(prefix_block_hashes(b"x" * 65, 0, 64, 256)) == 2


def test_cap_truncates_before_the_tail():
    data = bytes(range(200))
    capped = prefix_block_hashes(data, 5, 64, 2)
    assert capped == prefix_block_hashes(data, 5, 64, 256)[:2]
    assert len(capped) == 2
    assert prefix_block_hashes(data, 5, 64, 0) == []


def test_a_block_hash_names_the_whole_prefix():
    a = prefix_block_hashes(b"A" * 64 + b"B" * 64, 1, 64, 256)
    b = prefix_block_hashes(b"C" * 64 + b"B" * 64, 1, 64, 256)
    assert a[1] != b[1]
    shared = prefix_block_hashes(b"A" * 64 + b"Z" * 64, 1, 64, 256)
    assert shared[0] == a[0] and shared[1] != a[1]


def produced_state(prod, request, pool) -> PrefixRequestState:
    prod.produce(request, candidates_of(pool))
    return request.state[prod.state_key]


def test_producer_seeds_by_target_model_and_cache_salt():
    pool = make_pool(1)
    prod = producer()
    prompt = "p" * 100
    base = produced_state(prod, make_request(prompt, model="m"), pool).hashes
    assert base == prefix_block_hashes(prompt.encode(), prefix_seed("m"), 64, 256)
    other_model = produced_state(prod, make_request(prompt, model="m", target_model="m-lora"), pool).hashes
    salted = produced_state(prod, make_request(prompt, model="m", cache_salt="s"), pool).hashes
    assert other_model == prefix_block_hashes(prompt.encode(), prefix_seed("m-lora"), 64, 256)
    assert salted == prefix_block_hashes(prompt.encode(), prefix_seed("m", "s"), 64, 256)
    assert len({base[0], other_model[0], salted[0]}) == 3


def test_characters_are_utf8_bytes():
    pool = make_pool(1)
    state = produced_state(producer(), make_request("é" * 32), pool)  # 32 characters, 64 bytes
    assert len(state.hashes) == 1


def test_block_size_and_caps_from_parameters():
    pool = make_pool(1)
    prompt = "x" * 1000
    assert (
        len(produced_state(producer(blockSizeTokens=8), make_request(prompt), pool).hashes) == 32
    )  # 32 chars
    assert len(produced_state(producer(maxPrefixBlocksToMatch=5), make_request(prompt), pool).hashes) == 5
    capped = producer(maxPrefixBlocksToMatch=5, maxPrefixTokensToMatch=48)
    assert len(produced_state(capped, make_request(prompt), pool).hashes) == 3  # 48 tokens / 16


def test_auto_tune_takes_the_first_reported_block_size():
    pool = make_pool(3, block_size=[0, 8, 32])
    assert produced_state(producer(), make_request("x" * 100), pool).block_size_tokens == 8
    assert produced_state(producer(autoTune=False), make_request("x" * 100), pool).block_size_tokens == 16
    assert produced_state(producer(), make_request("x" * 100), make_pool(2)).block_size_tokens == 16


# --- the index -----------------------------------------------------------------------------------------


def test_match_counts_a_strict_per_server_prefix():
    index = PrefixIndex()
    index.insert("a", [1, 2], 100)
    index.insert("a", [4], 100)  # a holds 1, 2, 4 but not 3
    index.insert("b", [1, 2, 3, 4], 100)
    index.insert("c", [2, 3, 4], 100)  # no first block: no prefix at all
    index.insert("d", [1], 100)
    # The original would count a as 3 (blocks 1, 2, 4 within the global run); its strict prefix is 2.
    assert index.match([1, 2, 3, 4]) == {"a": 2, "b": 4, "d": 1}
    assert index.match([1, 2, 3, 4, 5]) == {"a": 2, "b": 4, "d": 1}
    assert index.match([2, 3]) == {"a": 1, "b": 2, "c": 2}
    assert index.match([9, 1]) == {}
    assert index.match([]) == {}


def test_match_when_every_server_drops_out_at_once():
    index = PrefixIndex()
    index.insert("a", [1, 2], 100)
    index.insert("b", [1, 2], 100)
    index.insert("c", [7, 3], 100)
    assert index.match([1, 2, 3]) == {"a": 2, "b": 2}


def test_lru_evicts_the_least_recently_used_and_forgets_the_server():
    index = PrefixIndex()
    index.insert("a", [1, 2, 3], 3)  # leading block most recent: LRU order 3, 2, 1
    index.insert("b", [1, 2, 3], 3)
    index.insert("a", [7], 3)  # evicts 3 from a
    assert index.holders(3) == {"b"}
    assert index.match([1, 2, 3]) == {"a": 2, "b": 3}
    index.insert("a", [2], 3)  # touch 2: LRU order now 1, 7, 2
    index.insert("a", [8], 3)  # evicts 1
    assert index.holders(1) == {"b"}
    assert index.match([1, 2, 3]) == {"b": 3}
    assert index.server_size("a") == 3 and len(index) == 6


def test_evicted_hash_with_no_holder_leaves_the_index():
    index = PrefixIndex()
    index.insert("a", [1, 2], 2)
    index.insert("a", [3, 4], 2)
    assert index.holders(1) == frozenset()
    assert index.distinct_blocks == 2
    assert index.match([3, 4]) == {"a": 2}


def test_lower_capacity_evicts_down_on_the_next_insert():
    index = PrefixIndex()
    index.insert("a", list(range(10)), 100)
    index.insert("a", [10], 4)
    assert index.server_size("a") == 4


def test_remove_and_retain_servers():
    index = PrefixIndex()
    for server in ("a", "b", "c"):
        index.insert(server, [1, 2], 10)
    index.insert("c", [5], 10)
    assert index.retain_servers(["a", "x"]) == ["b", "c"]
    assert index.servers == ["a"]
    assert index.holders(1) == {"a"} and index.holders(5) == frozenset()
    index.remove_server("a")
    index.remove_server("never-there")
    assert len(index) == 0 and index.distinct_blocks == 0 and index.match([1]) == {}


def test_a_departed_servers_slot_is_reused_without_inheriting_its_blocks():
    index = PrefixIndex()
    for server in ("a", "b"):
        index.insert(server, [1, 2], 10)
    index.remove_server("a")
    index.insert("new", [3], 10)
    assert index.match([1, 2]) == {"b": 2}
    assert index.match([3]) == {"new": 1}
    assert index.holders(1) == {"b"}


def test_many_servers():
    index = PrefixIndex()
    for i in range(200):
        index.insert(f"s{i}", [1, 2, 3][: 1 + i % 3], 10)
    matched = index.match([1, 2, 3])
    assert len(matched) == 200
    assert matched["s0"] == 1 and matched["s1"] == 2 and matched["s2"] == 3 and matched["s199"] == 2


# --- producer + pre-request ------------------------------------------------------------------------------


def test_produce_attaches_aligned_match_arrays():
    pool = make_pool(4)
    a = addresses(4)
    prod = producer(pool=pool)
    prompt = "shared system prompt. " * 10  # 220 chars: 3 full blocks and a tail
    prod.pre_request(make_request(prompt), result_for(pool.get(a[2])))
    prod.pre_request(make_request(prompt[:128] + "other"), result_for(pool.get(a[0])))

    candidates = candidates_of(pool).subset(np.array([3, 2, 0]))
    prod.produce(make_request(prompt), candidates)
    np.testing.assert_array_equal(candidates.attrs[PREFIX_MATCH_BLOCKS], [0, 4, 2])
    np.testing.assert_array_equal(candidates.attrs[PREFIX_TOTAL_BLOCKS], [4, 4, 4])
    np.testing.assert_array_equal(candidates.attrs[PREFIX_BLOCK_SIZE_TOKENS], [16, 16, 16])
    np.testing.assert_allclose(prefix_match_ratio(candidates), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(prefix_match_ratio(candidates.subset(np.array([2]))), [0.5])


def test_pre_request_records_what_the_target_held_of_the_prompt():
    pool = make_pool(3)
    a = addresses(3)
    prod = producer(pool=pool)
    prompt = "z" * 256  # 4 blocks of 64 characters (16 tokens each)
    prod.pre_request(make_request(prompt[:128] + "x" * 128), result_for(pool.get(a[1])))  # a[1] holds 2 of 4

    for target, expected in ((a[1], 32), (a[2], 0)):
        request = make_request(prompt, prompt_tokens=64)
        prod.produce(request, candidates_of(pool))
        outcome = prod.pre_request(request, result_for(pool.get(target)))
        assert outcome is not None and outcome.cached_prompt_tokens == expected
    # a[2] now holds the whole prompt (the insert came after the estimate).
    request = make_request(prompt, prompt_tokens=64)
    prod.produce(request, candidates_of(pool))
    outcome = prod.pre_request(request, result_for(pool.get(a[2])))
    assert outcome is not None and outcome.cached_prompt_tokens == 64


def test_cached_tokens_are_the_share_of_hashed_blocks_even_past_the_cap():
    pool = make_pool(1)
    (a,) = addresses(1)
    prod = producer(pool=pool, maxPrefixBlocksToMatch=4)
    prompt = "z" * 4000  # 1,000 tokens, of which the index hashes the first 4 blocks
    for expected in (0, 1000):
        request = make_request(prompt, prompt_tokens=1000)
        prod.produce(request, candidates_of(pool))
        outcome = prod.pre_request(request, result_for(pool.get(a)))
        assert outcome is not None and outcome.cached_prompt_tokens == expected


def test_short_prompt_matches_nothing():
    pool = make_pool(2)
    prod = producer(pool=pool)
    request = make_request("hi")
    prod.pre_request(request, result_for(pool.get(addresses(2)[0])))
    candidates = candidates_of(pool)
    prod.produce(make_request("hi"), candidates)
    np.testing.assert_array_equal(candidates.attrs[PREFIX_TOTAL_BLOCKS], [0, 0])
    np.testing.assert_allclose(prefix_match_ratio(candidates), [0.0, 0.0])
    assert len(prod.index) == 0


def test_pre_request_inserts_for_primary_and_prefill_targets():
    pool = make_pool(3)
    a = addresses(3)
    prod = producer(pool=pool)
    request = make_request("y" * 130)
    prod.produce(request, candidates_of(pool))
    prod.pre_request(request, result_for(pool.get(a[1]), pool.get(a[2]), prefill=pool.get(a[0])))
    hashes = request.state[prod.state_key].hashes
    assert len(hashes) == 3
    assert prod.index.match(hashes) == {a[1]: 3, a[0]: 3}


def test_lru_capacity_from_num_gpu_blocks_when_auto_tuned():
    pool = make_pool(2, num_gpu_blocks=[2, 0])
    a = addresses(2)
    prompt = "z" * 64 * 5
    tuned = producer(pool=pool, lruCapacityPerServer=3)
    for address in a:
        tuned.pre_request(make_request(prompt), result_for(pool.get(address)))
    assert [tuned.index.server_size(x) for x in a] == [2, 3]
    fixed = producer(pool=pool, lruCapacityPerServer=3, autoTune=False)
    fixed.pre_request(make_request(prompt), result_for(pool.get(a[0])))
    assert fixed.index.server_size(a[0]) == 3


def test_departed_servers_are_ignored_then_dropped():
    pool = make_pool(3)
    a = addresses(3)
    prod = producer(pool=pool)
    prompt = "w" * 200
    for address in a:
        prod.pre_request(make_request(prompt), result_for(pool.get(address)))
    pool.remove(a[1])
    candidates = candidates_of(pool)
    prod.produce(make_request(prompt), candidates)
    np.testing.assert_array_equal(candidates.attrs[PREFIX_MATCH_BLOCKS], [4, 4])
    assert prod.drop_departed_servers() == [a[1]]
    assert set(prod.index.servers) == {a[0], a[2]}


def test_drop_needs_a_pool():
    with pytest.raises(ValueError, match="no pool"):
        producer().drop_departed_servers()


def test_default_setup_sends_a_repeated_prefix_back_to_its_pod():
    pool = make_pool(6, waiting=[3, 3, 3, 3, 3, 3], kv_usage=[0.5] * 6)
    director = make_director(pool, seed=3)
    system_prompt = "You are a helpful assistant that answers in French. " * 40

    def route(prompt: str) -> str:
        return serve(director, make_request(prompt)).target.address

    first = route(system_prompt + "Question 1")
    assert all(route(system_prompt + f"Question {i}") == first for i in range(2, 10))
