"""KVBlockIndex: every rule of how a pod's events change what it is said to hold."""

from __future__ import annotations

import pytest

from slorouter.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch
from slorouter.pool.kv_index import KVBlockIndex


def batch(*events: KVEvent) -> KVEventBatch:
    return KVEventBatch(0.0, list(events))


def stored(hashes: list[int], medium: str | None = "GPU", block_size: int = 16) -> BlockStored:
    return BlockStored(hashes, None, [], block_size, None, medium, None)


def test_stored_blocks_match_as_leading_runs_per_pod() -> None:
    index = KVBlockIndex()
    index.apply("a", batch(stored([1, 2, 3])))
    index.apply("b", batch(stored([1, 2]), stored([4])))
    assert index.match([1, 2, 3, 4], ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 0}
    assert index.match([2, 3], ["a", "b"]) == {"a": 2, "b": 1}
    assert index.match([], ["a"]) == {"a": 0}
    assert index.block_size("a") == 16 and index.block_size("c") == 0
    assert index.num_blocks("b") == 3 and index.distinct_blocks == 4


def test_a_gap_in_the_chain_stops_the_match() -> None:
    index = KVBlockIndex()
    index.apply("a", batch(stored([1, 3])))
    assert index.match([1, 2, 3], ["a"]) == {"a": 1}


def test_removed_and_cleared() -> None:
    index = KVBlockIndex()
    index.apply("a", batch(stored([1, 2, 3])))
    index.apply("b", batch(stored([1, 2])))
    index.apply("a", batch(BlockRemoved([2], "GPU"), BlockRemoved([99], "GPU")))  # 99: never held, ignored
    assert index.match([1, 2, 3], ["a", "b"]) == {"a": 1, "b": 2}
    index.apply("b", batch(AllBlocksCleared()))
    assert index.match([1], ["a", "b"]) == {"a": 1, "b": 0}
    assert index.num_blocks("b") == 0
    assert index.distinct_blocks == 2  # 1 and 3, held by a


def test_blocks_in_other_media_are_ignored() -> None:
    index = KVBlockIndex()
    index.apply("a", batch(stored([1], medium="CPU"), stored([2], medium=None)))
    index.apply("a", batch(BlockRemoved([2], "CPU")))
    assert index.match([1], ["a"]) == {"a": 0}
    assert index.match([2], ["a"]) == {"a": 1}


def test_publishing_means_a_batch_was_applied() -> None:
    index = KVBlockIndex()
    assert not index.publishing("a")
    index.pod_stats("a").gaps += 1  # counters alone do not make a pod publish
    assert not index.publishing("a")
    index.apply("a", batch())
    assert index.publishing("a")
    assert index.pod_stats("a").batches == 1


def test_overflow_clears_the_pod_and_is_counted() -> None:
    index = KVBlockIndex(max_blocks_per_pod=3)
    index.apply("a", batch(stored([1, 2, 3])))
    index.apply("a", batch(stored([4]), stored([5])))
    assert index.pod_stats("a").overflows == 1
    assert index.num_blocks("a") == 1  # cleared at 4 blocks, then 5 came in
    assert index.match([5], ["a"]) == {"a": 1}
    with pytest.raises(ValueError):
        KVBlockIndex(max_blocks_per_pod=0)


def test_duplicate_stores_count_once() -> None:
    index = KVBlockIndex()
    index.apply("a", batch(stored([1]), stored([1])))
    index.apply("a", batch(BlockRemoved([1], "GPU")))
    assert index.match([1], ["a"]) == {"a": 0}


def test_speculative_claims_count_as_held_until_released() -> None:
    index = KVBlockIndex()
    index.apply("a", batch(stored([1])))
    index.speculate("a", [1, 2, 3])
    index.speculate("a", [1, 2])
    assert index.match([1, 2, 3], ["a"]) == {"a": 3}
    index.unspeculate("a", [1, 2, 3])
    assert index.match([1, 2, 3], ["a"]) == {"a": 2}  # the second claim still holds 1, 2
    index.unspeculate("a", [1, 2])
    assert index.match([1, 2, 3], ["a"]) == {"a": 1}  # 1 is stored
    assert index.speculative_claims == 0
    index.unspeculate("a", [7])  # nothing to release
    index.unspeculate("nobody", [1])


def test_a_removed_pod_is_forgotten_and_its_slot_reused_without_touching_the_others() -> None:
    index = KVBlockIndex()
    index.apply("a", batch(stored([1, 2])))
    index.apply("b", batch(stored([1, 2, 3])))
    index.speculate("a", [7, 8])
    index.speculate("b", [7])
    index.remove_pod("a")
    assert index.addresses == {"b"}
    assert not index.publishing("a") and index.num_blocks("a") == 0
    assert index.match([1, 2, 3], ["a", "b"]) == {"a": 0, "b": 3}
    assert index.match([7, 8], ["b"]) == {"b": 1}
    assert index.speculative_claims == 1 and index.distinct_blocks == 3
    index.unspeculate("a", [7, 8])  # a release after the pod left: nothing to take away
    assert index.speculative_claims == 1
    # The next pod takes a's slot; none of a's blocks or claims come with it, and b keeps its own.
    index.apply("c", batch(stored([9])))
    assert index.match([1], ["c"]) == {"c": 0} and index.match([7], ["c"]) == {"c": 0}
    assert index.match([9], ["b", "c"]) == {"b": 0, "c": 1}
    assert index.pod_stats("c").batches == 1
    index.remove_pod("b")
    index.remove_pod("c")
    index.remove_pod("never-there")
    assert index.addresses == frozenset() and index.distinct_blocks == 0 and index.speculative_claims == 0


def test_slots_stay_few_across_many_joins_and_leaves() -> None:
    index = KVBlockIndex()
    index.apply("stays", batch(stored([1])))
    for i in range(1000):
        index.apply(f"pod-{i}", batch(stored([1, 100 + i])))
        index.remove_pod(f"pod-{i}")
    index.apply("last", batch(stored([1])))
    assert index.match([1], ["stays", "last"]) == {"stays": 1, "last": 1}
    assert index.distinct_blocks == 1
    assert max(pod.bit for pod in index._pods.values()) == 2  # slot 1, freed 1000 times, reused
