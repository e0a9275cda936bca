"""The simulated engine's KV events: replayed in order they rebuild its prefix cache exactly."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from xxhash import xxh3_64_intdigest

from slorouter.kvevents.sim_hash import ROOT_HASH, block_hashes
from slorouter.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from slorouter.sim.engine import Engine
from slorouter.sim.kv_cache import KVBlockManager
from slorouter.sim.kv_events import KVEventRecorder
from slorouter.sim.profiles import get_profile
from slorouter.tokenizer import encode_bytes, token_ids_to_bytes
from tests.sim.conftest import drive


def replay(events: list[KVEvent]) -> set[int]:
    held: set[int] = set()
    for event in events:
        if isinstance(event, BlockStored):
            assert not held & set(event.block_hashes), "a stored block was already held"
            held |= set(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            assert set(event.block_hashes) <= held, "a removed block was not held"
            held -= set(event.block_hashes)
        else:
            assert isinstance(event, AllBlocksCleared)
            held.clear()
    return held


def cached_hashes(manager: KVBlockManager) -> set[int]:
    return set(manager._cached)


def small_engine(blocks: int) -> Engine:
    return Engine(dataclasses.replace(get_profile("llama3-8b-h100"), num_gpu_blocks=blocks), seed=0)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 300), st.integers(1, 40), st.floats(0, 2)),
        min_size=1,
        max_size=12,
    ),
    st.integers(40, 120),
)
def test_events_replayed_in_order_equal_the_prefix_cache(requests, blocks) -> None:
    engine = small_engine(blocks)
    recorder = KVEventRecorder.attach(engine.kv_blocks)
    prefixes = [f"shared prefix {k} " * 40 for k in range(6)]
    arrivals = [
        (i, encode_bytes(prefixes[p] + "q" * tail), out, at) for i, (p, tail, out, at) in enumerate(requests)
    ]
    arrivals = [a for a in arrivals if len(a[1]) // 4 + a[2] <= blocks * 16]
    drive(engine, arrivals)
    assert replay(recorder.drain()) == cached_hashes(engine.kv_blocks)


def test_stored_events_carry_the_chain_their_token_ids_hash_to() -> None:
    engine = small_engine(64)
    recorder = KVEventRecorder.attach(engine.kv_blocks)
    prompt = encode_bytes("x" * 64 * 5 + "tail")
    drive(engine, [(0, prompt, 40, 0.0)])
    events = [e for e in recorder.drain() if isinstance(e, BlockStored)]
    first = events[0]
    assert first.parent_block_hash is None
    # One run of consecutive blocks (the events were drained once): the prompt's, then generated ones.
    assert first.block_hashes[:5] == block_hashes(prompt, 16) == engine.kv_blocks.prompt_block_hashes(prompt)
    assert token_ids_to_bytes(first.token_ids)[: 5 * 64] == prompt[: 5 * 64]
    parent = ROOT_HASH
    for event in events:
        assert event.block_size == 16 and event.medium == "GPU"
        assert event.parent_block_hash == (None if parent == ROOT_HASH else parent)
        data = token_ids_to_bytes(event.token_ids)
        for j, block_hash in enumerate(event.block_hashes):  # each block's hash chains on the previous one
            assert block_hash == xxh3_64_intdigest(data[j * 64 : (j + 1) * 64], parent)
            parent = block_hash


def test_without_token_ids_the_events_are_the_same_but_empty_of_tokens() -> None:
    engine = small_engine(64)
    recorder = KVEventRecorder.attach(engine.kv_blocks, token_ids=False)
    drive(engine, [(0, encode_bytes("y" * 64 * 3), 20, 0.0)])
    stored = [e for e in recorder.drain() if isinstance(e, BlockStored)]
    assert stored and all(e.token_ids == [] for e in stored)


def test_no_recorder_no_events() -> None:
    assert small_engine(8).kv_blocks.events is None
