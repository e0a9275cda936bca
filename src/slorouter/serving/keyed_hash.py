"""SipHash-2-4 of 64-bit values under a secret key, vectorised with numpy.

SipHash (Aumasson and Bernstein, 2012) is a pseudorandom function for short inputs: without the 128-bit
key, its outputs say nothing about its inputs but their equality. The recording keys its prefix-block
hashes with it (``slorouter.serving.recording``): a whole batch of hashes costs the same few dozen numpy
operations, where a keyed hash per value would cost a Python call each.
"""

from __future__ import annotations

import numpy as np

_U64 = np.uint64
_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)
_LAST_BLOCK = _U64(8 << 56)  # the final block of an 8-byte message: its length in the top byte
_FF = _U64(0xFF)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U64(r)) | (x >> _U64(64 - r))


def _rounds(v: list[np.ndarray], count: int) -> None:
    v0, v1, v2, v3 = v
    for _ in range(count):
        v0 = v0 + v1
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = v2 + v3
        v3 = _rotl(v3, 16) ^ v2
        v0 = v0 + v3
        v3 = _rotl(v3, 21) ^ v0
        v2 = v2 + v1
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
    v[:] = [v0, v1, v2, v3]


def siphash24(values: np.ndarray, key: bytes) -> np.ndarray:
    """SipHash-2-4 of each value (as its 8 little-endian bytes) under the 16-byte ``key``; uint64."""
    if len(key) != 16:
        raise ValueError(f"SipHash takes a 16-byte key, got {len(key)} bytes")
    m = np.asarray(values, dtype=_U64)
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    v = [np.full(m.shape, init ^ k, dtype=_U64) for init, k in zip(_INIT, (k0, k1, k0, k1), strict=True)]
    v[3] ^= m
    _rounds(v, 2)
    v[0] ^= m
    v[3] ^= _LAST_BLOCK
    _rounds(v, 2)
    v[0] ^= _LAST_BLOCK
    v[2] ^= _FF
    _rounds(v, 4)
    result: np.ndarray = v[0] ^ v[1] ^ v[2] ^ v[3]
    return result
