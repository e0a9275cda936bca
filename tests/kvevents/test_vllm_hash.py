"""slorouter.kvevents.vllm_hash equals vLLM's own block hashing: on the cases vLLM computed
(``data/vllm_block_hashes.json``), and, where a vLLM is installed (``SLOROUTER_VLLM_SITE``), on
Hypothesis-generated token ids, block sizes, algorithms, seeds and extra keys asked of it directly."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slorouter.kvevents.vllm_hash import (
    DEFAULT_NONE_HASH_SEED,
    HASH_ALGORITHMS,
    ExtraKeys,
    VllmBlockHasher,
    event_hash,
    hash_function,
)
from slorouter.kvevents.wire import BlockRemoved, BlockStored, KVEventDecodeError, decode_batch

from . import vllm_reference
from .vllm_vectors import EXTRA_KEYS, Case, ask_vllm, load_vectors

VERSION, VECTORS = load_vectors()


def ours(case: Case) -> VllmBlockHasher:
    return VllmBlockHasher(case.algorithm, case.seed)


def extra(case: Case) -> ExtraKeys:
    return ExtraKeys(case.lora, case.cache_salt or "")


def test_the_vectors_cover_every_algorithm_seeds_block_sizes_and_extra_keys() -> None:
    assert VERSION.startswith("0.33.0")
    cases = [case for case, _ in VECTORS]
    assert {c.algorithm for c in cases} == set(HASH_ALGORITHMS)
    assert {c.seed for c in cases} == {None, "0", "42"}
    assert {1, 3, 16} <= {c.block_size for c in cases}
    assert {(c.lora, c.cache_salt) for c in cases} >= set(EXTRA_KEYS)
    assert sum(len(found.digests) for _, found in VECTORS) > 250


@pytest.mark.parametrize(("case", "found"), VECTORS, ids=[c.name for c, _ in VECTORS])
def test_digests_and_event_hashes_equal_vllms(case: Case, found: object) -> None:
    hasher = ours(case)
    assert hasher.digests(case.token_ids, case.block_size, extra(case)) == found.digests  # type: ignore[attr-defined]
    assert hasher.block_hashes(case.token_ids, case.block_size, extra(case)) == found.event_hashes  # type: ignore[attr-defined]


def test_without_a_seed_the_sha256_pods_root_at_vllms_fixed_seed() -> None:
    for algorithm in ("sha256", "sha256_cbor"):
        assert VllmBlockHasher(algorithm).none_hash == hash_function(algorithm)(DEFAULT_NONE_HASH_SEED)
        assert VllmBlockHasher(algorithm, "0").none_hash == hash_function(algorithm)("0")


@pytest.mark.parametrize("algorithm", ["xxhash", "xxhash_cbor"])
def test_xxhash_pods_without_a_seed_cannot_be_reproduced(algorithm: str) -> None:
    with pytest.raises(ValueError, match="set PYTHONHASHSEED on the pods"):
        VllmBlockHasher(algorithm)


def test_unknown_algorithms_and_block_sizes_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown hash algorithm 'md5'"):
        VllmBlockHasher("md5")
    with pytest.raises(ValueError, match="block size 0"):
        VllmBlockHasher().digests([1, 2], 0)


def test_partial_blocks_are_not_hashed_and_salt_only_changes_the_chain_from_block_0() -> None:
    hasher = VllmBlockHasher("sha256_cbor", "0")
    assert hasher.block_hashes(list(range(15)), 16) == []
    plain = hasher.block_hashes(list(range(48)), 16)
    salted = hasher.block_hashes(list(range(48)), 16, ExtraKeys(cache_salt="x"))
    assert len(plain) == 3 and all(a != b for a, b in zip(plain, salted, strict=True))
    assert ExtraKeys(cache_salt="x").of_block(1) is None
    assert ExtraKeys(("n", "/p"), "x").of_block(1) == (("lora", "n", "/p"),)


@pytest.mark.parametrize("algorithm", ["sha256_cbor", "xxhash_cbor"])
def test_the_cbor_fast_path_is_cbor2s_encoding(algorithm: str) -> None:
    edges = [0, 23, 24, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**64 - 1, 2**64, -1, -25, -(2**40)]
    hasher = VllmBlockHasher(algorithm, "0")
    function = hash_function(algorithm)
    for tokens in (edges[:7], edges[:8], edges, list(range(40))):
        for size in (1, 2, 7):
            for keys in (ExtraKeys(), ExtraKeys(("n", "/p"), "salt")):
                parent, expected = hasher.none_hash, []
                for i in range(len(tokens) // size):
                    block = tuple(tokens[i * size : (i + 1) * size])
                    parent = function((parent, block, keys.of_block(i)))
                    expected.append(parent)
                assert hasher.digests(tokens, size, keys) == expected


def test_the_event_form_is_the_digests_low_64_bits() -> None:
    digest = bytes(range(32))
    assert event_hash(digest) == int.from_bytes(digest[-8:], "big")


def test_events_with_digest_bytes_decode_to_the_int_vllm_would_send() -> None:
    case, found = VECTORS[0]
    digests = found.digests
    stored = {
        "type": "BlockStored",
        "block_hashes": digests,
        "parent_block_hash": digests[0] if digests else b"\x01",
        "token_ids": case.token_ids,
        "block_size": case.block_size,
        "extra_keys": None,
    }
    removed = {"type": "BlockRemoved", "block_hashes": digests[:1], "medium": "GPU"}
    batch = decode_batch(msgspec.msgpack.encode([0.0, [stored, removed], None]))
    first, second = batch.events
    assert isinstance(first, BlockStored) and isinstance(second, BlockRemoved)
    assert first.block_hashes == found.event_hashes
    assert first.parent_block_hash == event_hash(stored["parent_block_hash"])  # type: ignore[arg-type]
    assert second.block_hashes == found.event_hashes[:1]
    legacy = ["BlockStored", digests, None, case.token_ids, case.block_size, None, "GPU"]
    decoded = decode_batch(msgspec.msgpack.encode([0.0, [legacy]]))
    assert decoded.events[0].block_hashes == found.event_hashes  # type: ignore[union-attr]
    with pytest.raises(KVEventDecodeError, match="empty block hash"):
        decode_batch(msgspec.msgpack.encode([0.0, [{**stored, "block_hashes": [b""]}]]))


# --- against vLLM itself, where installed -----------------------------------------------------------------

SITE = vllm_reference.site_from_env()
needs_vllm = pytest.mark.skipif(
    SITE is None, reason=f"no vLLM to ask ({vllm_reference.SITE_ENV} unset; `make vllm-parity` sets it)"
)


@pytest.fixture(scope="module")
def vllm() -> tuple[object, object]:
    assert SITE is not None
    hashing, utils, _ = vllm_reference.load(SITE)
    return hashing, utils


@needs_vllm
def test_the_recorded_vectors_are_what_the_installed_vllm_computes(vllm: tuple[object, object]) -> None:
    hashing, utils = vllm
    for case, found in VECTORS:
        assert ask_vllm(hashing, utils, case) == found, case.name  # type: ignore[arg-type]


cases = st.builds(
    Case,
    name=st.just("hypothesis"),
    algorithm=st.sampled_from(HASH_ALGORITHMS),
    seed=st.one_of(st.none(), st.sampled_from(["0", "1", "42", "123456789"])),
    block_size=st.sampled_from([1, 2, 5, 16, 32, 64]),
    token_ids=st.lists(
        st.one_of(st.integers(0, 255), st.integers(0, 200_000), st.integers(0, 2**31 - 1)), max_size=200
    ),
    lora=st.one_of(st.none(), st.tuples(st.text(max_size=12), st.text(max_size=20))),
    cache_salt=st.one_of(st.none(), st.text(max_size=12)),
).filter(lambda c: c.seed is not None or not c.algorithm.startswith("xxhash"))


@needs_vllm
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases)
def test_hypothesis_token_ids_hash_as_vllm_hashes_them(vllm: tuple[object, object], case: Case) -> None:
    hashing, utils = vllm
    found = ask_vllm(hashing, utils, case)  # type: ignore[arg-type]
    assert ours(case).digests(case.token_ids, case.block_size, extra(case)) == found.digests
    assert ours(case).block_hashes(case.token_ids, case.block_size, extra(case)) == found.event_hashes
