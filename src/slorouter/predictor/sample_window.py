"""The sample window on disk: a ``SampleStore``'s samples saved so that training resumes after a restart.

One file, replaced atomically (``atomic.write_atomic``): ``MAGIC``, an 8-byte big-endian header length, a
JSON header (feature schema, pool shape, save time, per kind its row count, width, ``total_added`` and
``trained_mark``, the payload's size and SHA-256), then the payload: per kind (``MODEL_KINDS`` order) the
float32 feature rows, the float32 latencies and the int64 arrival numbers, little-endian. A truncated,
corrupt or foreign file raises ``WindowFileError``; the checksum is verified before anything is trusted.

The file holds only the samples the store holds, so it is bounded like the store (``max_file_bytes``).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slorouter.predictor.atomic import write_atomic
from slorouter.predictor.features import MODEL_KINDS, ModelKind
from slorouter.predictor.pool_shape import PoolShape
from slorouter.predictor.store import SampleStore

MAGIC = b"SLOROUTER-SAMPLES/1\n"
_HEADER_LIMIT = 1 << 20
_ROW_EXTRA_BYTES = 4 + 8  # latency (float32) and arrival number (int64) next to the features


class WindowFileError(ValueError):
    """Bytes that are not a complete, intact sample-window file."""


@dataclass(frozen=True, slots=True)
class KindWindow:
    X: np.ndarray  # float32 (n, width), oldest first
    y: np.ndarray  # float32 latencies, ms
    seq: np.ndarray  # int64 arrival numbers, increasing
    total_added: int
    trained_mark: int


@dataclass(frozen=True, slots=True)
class SavedWindow:
    schema: dict[str, Any]  # FeatureSchema.to_dict() of the store that was saved
    pool_shape: dict[str, Any] | None  # PoolShape.to_dict(), None when the saver did not know it
    saved_at: float  # unix time
    kinds: dict[ModelKind, KindWindow]

    @property
    def rows(self) -> int:
        return sum(len(k.seq) for k in self.kinds.values())


def max_file_bytes(store: SampleStore) -> int:
    """The largest window file ``store`` can produce (every reachable bucket full), header excluded."""
    return sum(
        store.capacity(kind) * (4 * len(store.schema.features(kind)) + _ROW_EXTRA_BYTES)
        for kind in MODEL_KINDS
    )


def encode_window(store: SampleStore, pool_shape: PoolShape | None, saved_at: float) -> bytes:
    kinds: dict[str, Any] = {}
    parts: list[bytes] = []
    for kind in MODEL_KINDS:
        snap = store.snapshot(kind)
        kinds[kind] = {
            "rows": len(snap.seq),
            "width": snap.X.shape[1],
            "total_added": snap.total_added,
            "trained_mark": min(store.trained_mark(kind), snap.total_added),
        }
        parts += [
            snap.X.astype("<f4", copy=False).tobytes(),
            snap.y.astype("<f4", copy=False).tobytes(),
            snap.seq.astype("<i8", copy=False).tobytes(),
        ]
    payload = b"".join(parts)
    header = json.dumps(
        {
            "schema": store.schema.to_dict(),
            "pool_shape": None if pool_shape is None else pool_shape.to_dict(),
            "saved_at": saved_at,
            "kinds": kinds,
            "payload_size": len(payload),
            "payload_sha256": hashlib.sha256(payload).hexdigest(),
        },
        separators=(",", ":"),
    ).encode()
    return b"".join((MAGIC, len(header).to_bytes(8, "big"), header, payload))


def decode_window(data: bytes) -> SavedWindow:
    """The window in ``data``; ``WindowFileError`` if it is truncated, corrupt or not a window file."""
    view = memoryview(data)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise WindowFileError("not a slorouter sample-window file (bad magic)")
    start = len(MAGIC) + 8
    if len(data) < start:
        raise WindowFileError("truncated sample-window file (no header length)")
    header_len = int.from_bytes(view[len(MAGIC) : start], "big")
    if header_len > _HEADER_LIMIT or len(data) < start + header_len:
        raise WindowFileError("truncated sample-window file (header)")
    try:
        header = json.loads(bytes(view[start : start + header_len]))
        size, digest = int(header["payload_size"]), str(header["payload_sha256"])
        schema, shape, saved_at = dict(header["schema"]), header["pool_shape"], float(header["saved_at"])
        layout = {kind: header["kinds"][kind] for kind in MODEL_KINDS}
        counts = {
            kind: (int(v["rows"]), int(v["width"]), int(v["total_added"]), int(v["trained_mark"]))
            for kind, v in layout.items()
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise WindowFileError(f"corrupt sample-window header: {exc!r}") from None
    payload = view[start + header_len :]
    if len(payload) != size:
        raise WindowFileError(f"truncated sample-window file: {len(payload)} of {size} payload bytes")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise WindowFileError("sample-window checksum mismatch")
    kinds: dict[ModelKind, KindWindow] = {}
    offset = 0
    for kind, (rows, width, total_added, trained_mark) in counts.items():
        if rows < 0 or width < 1:
            raise WindowFileError(f"corrupt sample-window header: {kind} has {rows} rows of {width} values")
        arrays = []
        for dtype, count in (("<f4", rows * width), ("<f4", rows), ("<i8", rows)):
            nbytes = count * np.dtype(dtype).itemsize
            if offset + nbytes > size:
                raise WindowFileError("sample-window payload shorter than its header says")
            arrays.append(np.frombuffer(payload[offset : offset + nbytes], dtype=dtype))
            offset += nbytes
        X, y, seq = arrays
        kinds[kind] = KindWindow(X.reshape(rows, width), y, seq, total_added, trained_mark)
    if offset != size:
        raise WindowFileError("sample-window payload longer than its header says")
    return SavedWindow(schema, None if shape is None else dict(shape), saved_at, kinds)


def save_window(
    path: Path, store: SampleStore, pool_shape: PoolShape | None, saved_at: float | None = None
) -> int:
    """Write ``store``'s window to ``path`` atomically, saved at ``saved_at`` (unix time, default now); the
    bytes written."""
    data = encode_window(store, pool_shape, time.time() if saved_at is None else saved_at)
    write_atomic(path, data)
    return len(data)


def read_window(path: Path) -> SavedWindow | None:
    """The window saved at ``path``, None when there is none; ``WindowFileError`` when it is damaged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_window(data)
