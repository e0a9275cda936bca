"""The KV-event wire format: round trips, both event encodings vLLM has used, and malformed input."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slorouter.kvevents.wire import (
    END_OF_REPLAY,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    decode_batch,
    encode_batch,
    parse_message,
    parse_seq,
    seq_frame,
)

hashes = st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=8)
media = st.sampled_from([None, "GPU", "CPU"])
stored = st.builds(
    BlockStored,
    block_hashes=hashes,
    parent_block_hash=st.none() | st.integers(min_value=0, max_value=2**64 - 1),
    token_ids=st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=32),
    block_size=st.integers(min_value=1, max_value=256),
    lora_id=st.none() | st.integers(min_value=0, max_value=1000),
    medium=media,
    lora_name=st.none() | st.text(max_size=8),
)
removed = st.builds(BlockRemoved, block_hashes=hashes, medium=media)
events = st.lists(stored | removed | st.just(AllBlocksCleared()), max_size=6)
batches = st.builds(
    KVEventBatch,
    ts=st.floats(allow_nan=False, allow_infinity=False),
    events=events,
    data_parallel_rank=st.none() | st.integers(min_value=0, max_value=7),
)


@given(batches)
def test_encode_decode_round_trips(batch: KVEventBatch) -> None:
    assert decode_batch(encode_batch(batch)) == batch


def test_the_encoding_is_vllms_positional_batch_of_tagged_maps() -> None:
    batch = KVEventBatch(1.5, [BlockStored([7], None, [1, 2], 2, None, "GPU", None), AllBlocksCleared()], 0)
    assert msgspec.msgpack.decode(encode_batch(batch)) == [
        1.5,
        [
            {
                "type": "BlockStored",
                "block_hashes": [7],
                "parent_block_hash": None,
                "token_ids": [1, 2],
                "block_size": 2,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            },
            {"type": "AllBlocksCleared"},
        ],
        0,
    ]


def test_legacy_positional_events_and_unknown_fields_decode() -> None:
    payload = msgspec.msgpack.encode(
        [
            2.0,
            [
                ["BlockStored", [1, 2], None, [5] * 4, 2, None, "GPU", None, [None, None]],  # + extra_keys
                ["BlockRemoved", [1], "GPU"],
                ["AllBlocksCleared"],
                {"type": "BlockRemoved", "block_hashes": [2], "medium": None, "group_idx": 0},
            ],
        ]
    )
    batch = decode_batch(payload)
    assert batch.events == [
        BlockStored([1, 2], None, [5] * 4, 2, None, "GPU", None),
        BlockRemoved([1], "GPU"),
        AllBlocksCleared(),
        BlockRemoved([2], None),
    ]
    assert batch.data_parallel_rank is None


def test_a_batch_sent_as_a_map_decodes() -> None:
    payload = msgspec.msgpack.encode({"ts": 1.0, "events": [{"type": "AllBlocksCleared"}]})
    assert decode_batch(payload).events == [AllBlocksCleared()]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "truncated"),
        (b"\xc1", "malformed"),
        (msgspec.msgpack.encode("batch"), "Expected `array`"),
        (msgspec.msgpack.encode([1.0, [{"type": "BlockMoved"}]]), "BlockMoved"),
        (msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1], 0]]]), "block_size 0"),
        (msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": ["x"]}]]), "block_hashes"),
    ],
)
def test_malformed_payloads_raise_a_clear_error(payload: bytes, message: str) -> None:
    with pytest.raises(KVEventDecodeError, match="malformed KV event batch") as info:
        decode_batch(payload)
    assert message in str(info.value)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_the_decode_error(payload: bytes) -> None:
    with contextlib.suppress(KVEventDecodeError):
        decode_batch(payload)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@given(msgpack_values)
def test_arbitrary_msgpack_never_raises_anything_but_the_decode_error(value: object) -> None:
    with contextlib.suppress(KVEventDecodeError):
        decode_batch(msgspec.msgpack.encode(value))


def test_frames() -> None:
    assert seq_frame(5) == (5).to_bytes(8, "big")
    assert parse_seq(seq_frame(2**40)) == 2**40
    assert parse_seq(END_OF_REPLAY) == -1
    assert parse_message([b"kv@a@m", seq_frame(3), b"p"]) == (b"kv@a@m", 3, b"p")
    with pytest.raises(KVEventDecodeError, match="3 frames"):
        parse_message([b"t", seq_frame(1)])
    with pytest.raises(KVEventDecodeError, match="sequence frame has 4 bytes"):
        parse_seq(b"\0\0\0\1")
