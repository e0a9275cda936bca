"""vLLM's prefix-cache block hashes, recomputed so the router's lookups match a real pod's KV events.

vLLM (v1 engine, ``vllm/v1/core/kv_cache_utils.py``) hashes a request's prompt in full blocks of
``block_size`` tokens, each block's hash naming its whole prefix::

    h_0 = H((NONE_HASH, tuple(tokens of block 0), extra_keys_0))
    h_i = H((h_{i-1},   tuple(tokens of block i), extra_keys_i))

``H`` is the engine's ``--prefix-caching-hash-algo``: ``sha256`` (the default: SHA-256 of the tuple's
``pickle`` at the highest protocol), ``sha256_cbor`` (SHA-256 of its canonical CBOR), ``xxhash`` and
``xxhash_cbor`` (XXH3-128 of the same two encodings). ``NONE_HASH`` is ``H(seed)`` of a string seed: the
pod's ``PYTHONHASHSEED`` when set; when unset, the fixed ``"vllm-none-hash"`` for the SHA-256 algorithms and
random bytes per process for the xxhash ones (whose hashes then cannot be reproduced).

Extra keys (``generate_block_hash_extra_keys``) are ``None`` or a tuple: ``("lora", name, path)`` on every
block of a LoRA request, then ``("cache_salt", salt)`` on the first block of a salted request (multimodal
inputs and prompt embeddings add keys of their own, which the router does not reproduce).

KV events carry a block's hash as vLLM's ``maybe_convert_block_hash`` makes it: by default
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) the digest's low 64 bits as an unsigned int, otherwise the digest
bytes, which ``slorouter.kvevents.wire`` reduces to the same int. ``block_hashes`` returns those ints.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2
import numpy as np
import xxhash

HASH_ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM's seed when PYTHONHASHSEED is unset (SHA-256 only)
_NON_CRYPTO = frozenset({"xxhash", "xxhash_cbor"})
_MASK64 = (1 << 64) - 1


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(value: Any) -> bytes:
    return cbor2.dumps(value, canonical=True)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xxh3_128(data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data)


# Canonical CBOR of a block's tuple without cbor2 (the tests hold it to cbor2's and vLLM's output): an array
# of 3, the parent's byte string, the token ids' array, the extra keys.
_PACK = tuple(struct.Struct(f">{code}").pack for code in "BHIQ")


def _cbor_head(major: int, n: int) -> bytes:
    """A CBOR item head: ``major`` type with argument ``n`` in its shortest form."""
    kind = major << 5
    if n < 24:
        return bytes((kind | n,))
    if n < 0x100:
        return bytes((kind | 24,)) + _PACK[0](n)
    if n < 0x10000:
        return bytes((kind | 25,)) + _PACK[1](n)
    if n < 0x100000000:
        return bytes((kind | 26,)) + _PACK[2](n)
    return bytes((kind | 27,)) + _PACK[3](n)


_U32_LIMIT = 0x100000000


def _cbor_tokens(token_ids: Sequence[int]) -> tuple[bytes, list[int]]:
    """Every token id as a CBOR unsigned integer, concatenated, and where each starts (one more at the end).

    Vectorised: each id's 4 big-endian bytes behind a head byte, of which the shortest form is kept (the id
    itself below 24; head 0x18, 0x19 or 0x1a and 1, 2 or 4 bytes above)."""
    try:
        ids = np.asarray(token_ids, dtype=np.int64)
        in_range = not ids.size or (ids.min() >= 0 and ids.max() < _U32_LIMIT)
    except OverflowError:
        in_range = False
    if not in_range:  # not token ids; cbor2 encodes them
        parts = [_cbor(t) for t in token_ids]
        return b"".join(parts), [0, *np.cumsum([len(p) for p in parts]).tolist()]
    n = ids.size
    wide = np.empty((n, 5), dtype=np.uint8)
    wide[:, 1:] = ids.astype(">u4").view(np.uint8).reshape(n, 4)
    value_bytes = np.select([ids < 24, ids < 0x100, ids < 0x10000], [0, 1, 2], 4)
    wide[:, 0] = np.select([ids < 24, ids < 0x100, ids < 0x10000], [ids, 0x18, 0x19], 0x1A)
    keep = np.arange(5) >= (5 - value_bytes)[:, None]
    keep[:, 0] = True
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(value_bytes + 1, out=offsets[1:])
    return wide[keep].tobytes(), offsets.tolist()


_FUNCTIONS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], bytes]]] = {
    "sha256": (_pickled, _sha256),
    "sha256_cbor": (_cbor, _sha256),
    "xxhash": (_pickled, _xxh3_128),
    "xxhash_cbor": (_cbor, _xxh3_128),
}


def hash_function(algorithm: str) -> Callable[[Any], bytes]:
    """vLLM's ``get_hash_fn_by_name``: the digest of a value under ``algorithm``."""
    try:
        encode, digest = _FUNCTIONS[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown hash algorithm {algorithm!r} (one of {', '.join(HASH_ALGORITHMS)})"
        ) from None
    return lambda value: digest(encode(value))


def none_hash_seed(algorithm: str, python_hash_seed: str | None) -> str:
    """The seed of ``NONE_HASH`` for pods running with ``PYTHONHASHSEED=python_hash_seed`` (None: unset).

    Raises ``ValueError`` for an xxhash algorithm without a seed: such pods seed with random bytes.
    """
    if python_hash_seed is not None:
        return python_hash_seed
    if algorithm in _NON_CRYPTO:
        raise ValueError(
            f"{algorithm} pods without PYTHONHASHSEED seed their block hashes at random, which cannot be "
            "reproduced: set PYTHONHASHSEED on the pods and the same value here"
        )
    return DEFAULT_NONE_HASH_SEED


def event_hash(digest: bytes) -> int:
    """A block digest as KV events carry it (vLLM's ``maybe_convert_block_hash``): its low 64 bits."""
    return int.from_bytes(digest, "big") & _MASK64


@dataclass(frozen=True, slots=True)
class ExtraKeys:
    """What a request adds to its blocks' hashes: a LoRA adapter ``(name, path)`` and a cache salt."""

    lora: tuple[str, str] | None = None
    cache_salt: str = ""

    def of_block(self, index: int) -> tuple[Any, ...] | None:
        keys: list[Any] = []
        if self.lora is not None:
            keys.append(("lora", *self.lora))
        if index == 0 and self.cache_salt:
            keys.append(("cache_salt", self.cache_salt))
        return tuple(keys) if keys else None


NO_EXTRA_KEYS = ExtraKeys()


@dataclass(frozen=True)
class VllmBlockHasher:
    """A pod's block-hash chain: its algorithm and its ``PYTHONHASHSEED`` (None: unset)."""

    algorithm: str = "sha256"
    python_hash_seed: str | None = None
    _hash: Callable[[Any], bytes] = field(init=False, repr=False, compare=False)
    _none_hash: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        function = hash_function(self.algorithm)
        object.__setattr__(self, "_hash", function)
        seed = none_hash_seed(self.algorithm, self.python_hash_seed)
        object.__setattr__(self, "_none_hash", function(seed))

    @property
    def none_hash(self) -> bytes:
        return self._none_hash

    def digests(
        self, token_ids: Sequence[int], block_size: int, extra: ExtraKeys = NO_EXTRA_KEYS
    ) -> list[bytes]:
        """The digests of every full block of ``token_ids`` (vLLM's ``hash_block_tokens`` chain)."""
        if block_size < 1:
            raise ValueError(f"block size {block_size} < 1")
        starts = range(0, len(token_ids) - block_size + 1, block_size)
        if self.algorithm.endswith("_cbor"):
            return self._cbor_digests(token_ids, block_size, extra, starts)
        digest = self._hash
        parent = self._none_hash
        out: list[bytes] = []
        for index, start in enumerate(starts):
            parent = digest((parent, tuple(token_ids[start : start + block_size]), extra.of_block(index)))
            out.append(parent)
        return out

    def _cbor_digests(
        self, token_ids: Sequence[int], block_size: int, extra: ExtraKeys, starts: range
    ) -> list[bytes]:
        """``digests`` for the CBOR algorithms: each token encoded once, each block's CBOR assembled."""
        digest = _sha256 if self.algorithm == "sha256_cbor" else _xxh3_128
        encoded, offsets = _cbor_tokens(token_ids[: len(starts) * block_size])
        first, rest = _cbor(extra.of_block(0)), _cbor(extra.of_block(1))
        parent = self._none_hash
        # [parent, tokens, extra]: the parent's head is fixed (every digest has the same length).
        head = b"\x83" + _cbor_head(2, len(parent))
        tokens_head = _cbor_head(4, block_size)
        out: list[bytes] = []
        for start in starts:
            tokens = encoded[offsets[start] : offsets[start + block_size]]
            parent = digest(b"".join((head, parent, tokens_head, tokens, rest if start else first)))
            out.append(parent)
        return out

    def block_hashes(
        self, token_ids: Sequence[int], block_size: int, extra: ExtraKeys = NO_EXTRA_KEYS
    ) -> list[int]:
        """The hashes the pod's ``BlockStored`` events give the full blocks of ``token_ids``."""
        return [event_hash(d) for d in self.digests(token_ids, block_size, extra)]
