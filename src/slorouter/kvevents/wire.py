"""The msgpack wire format of vLLM's KV-cache events (``vllm/distributed/kv_events.py``) and its ZMQ frames.

A publisher sends one multipart message per engine step: ``[topic, seq, payload]``, where ``seq`` is the
batch's sequence number as 8 big-endian bytes (0, 1, 2, … per publisher) and ``payload`` a msgpack
``KVEventBatch``. A subscriber that sees a sequence gap asks the publisher's ROUTER replay socket for the
batches from ``seq`` on (one frame: 8 big-endian bytes); each is answered as ``[seq, payload]`` and the
replay ends with ``[-1 as 8 signed big-endian bytes, b""]``.

Encodings: the batch is positional, ``[ts, events, data_parallel_rank]``. Each event is a tagged map
(``{"type": "BlockStored", "block_hashes": [...], ...}``), as vLLM emits since it dropped ``array_like`` from
the event structs (vllm-project/vllm#42892); older vLLM sent each event as a positional array whose first
element is the tag (``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium, ...]``). ``decode_batch`` reads both event forms, and a batch sent as a map too. Anything else raises
``KVEventDecodeError`` with what was wrong; unknown extra fields are ignored (vLLM keeps adding some).

Block hashes arrive as 64-bit ints (vLLM's default, ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) or as the
digest's bytes (``=0``); ``decode_batch`` turns bytes into the int vLLM would have sent, the digest's low 64
bits (its last 8 bytes, big-endian), so the index holds one form whatever the pod's setting.
"""

from __future__ import annotations

import msgspec

# Block hashes are integers: vLLM publishes its block hashes as 64-bit ints, the simulator its xxh3 chain.
BlockHash = int
# What a payload may carry for one: an int, or a digest's bytes.
WireHash = int | bytes
_MASK64 = (1 << 64) - 1

SEQ_BYTES = 8
END_OF_REPLAY = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
MEDIUM_GPU = "GPU"


class KVEventDecodeError(ValueError):
    """A KV-event frame or payload that does not follow the protocol."""


class BlockStored(msgspec.Struct, tag=True, gc=False):
    """Blocks that entered the prefix cache: consecutive blocks of one sequence, in chain order."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, gc=False):
    """Blocks evicted from the prefix cache."""

    block_hashes: list[BlockHash]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, gc=False):
    """The whole prefix cache was reset."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's events."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


# --- decoding: the two event forms --------------------------------------------------------------------


class _MapStored(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[WireHash]
    parent_block_hash: WireHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class _MapRemoved(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: list[WireHash]
    medium: str | None = None


class _LegacyStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    block_hashes: list[WireHash]
    parent_block_hash: WireHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class _LegacyRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    block_hashes: list[WireHash]
    medium: str | None = None


class _LegacyCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    pass


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _RawMapBatch(msgspec.Struct, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(_RawBatch)
_map_batch_decoder = msgspec.msgpack.Decoder(_RawMapBatch)
_event_decoder = msgspec.msgpack.Decoder(_MapStored | _MapRemoved | AllBlocksCleared)
_legacy_decoder = msgspec.msgpack.Decoder(_LegacyStored | _LegacyRemoved | _LegacyCleared)


def _is_map(data: bytes) -> bool:
    first = data[0] if data else 0
    return 0x80 <= first <= 0x8F or first in (0xDE, 0xDF)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """The batch in ``payload``; ``KVEventDecodeError`` says what is wrong with a malformed one."""
    try:
        raw = _map_batch_decoder.decode(payload) if _is_map(payload) else _batch_decoder.decode(payload)
        events = [_decode_event(bytes(event)) for event in raw.events]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise KVEventDecodeError(f"malformed KV event batch: {exc}") from None
    for event in events:
        if isinstance(event, BlockStored) and event.block_size < 1:
            raise KVEventDecodeError(
                f"malformed KV event batch: BlockStored.block_size {event.block_size} < 1"
            )
    return KVEventBatch(raw.ts, events, raw.data_parallel_rank)


def wire_hash(value: WireHash) -> BlockHash:
    """A block hash as the index keeps it: ints as they are, a digest's bytes as its low 64 bits."""
    if isinstance(value, bytes):
        if not value:
            raise KVEventDecodeError("malformed KV event batch: an empty block hash")
        return int.from_bytes(value, "big") & _MASK64
    return value


def _hashes(values: list[WireHash]) -> list[BlockHash]:
    return [v if isinstance(v, int) else wire_hash(v) for v in values]


def _decode_event(data: bytes) -> KVEvent:
    event = _event_decoder.decode(data) if _is_map(data) else _legacy_decoder.decode(data)
    if isinstance(event, _MapStored | _LegacyStored):
        parent = event.parent_block_hash
        return BlockStored(
            _hashes(event.block_hashes),
            None if parent is None else wire_hash(parent),
            event.token_ids,
            event.block_size,
            event.lora_id,
            event.medium,
            event.lora_name,
        )
    if isinstance(event, _MapRemoved | _LegacyRemoved):
        return BlockRemoved(_hashes(event.block_hashes), event.medium)
    return AllBlocksCleared()


# --- frames ---------------------------------------------------------------------------------------------


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")


def parse_seq(frame: bytes) -> int:
    """A sequence-number frame: 8 big-endian bytes (the replay's end marker, all ones, is -1)."""
    if len(frame) != SEQ_BYTES:
        raise KVEventDecodeError(f"sequence frame has {len(frame)} bytes, expected {SEQ_BYTES}")
    return int.from_bytes(frame, "big", signed=True)


def parse_message(frames: list[bytes]) -> tuple[bytes, int, bytes]:
    """``[topic, seq, payload]`` of a published message, checked for shape (the payload is not decoded)."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"a KV event message has 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq, payload = frames
    return topic, parse_seq(seq), payload
