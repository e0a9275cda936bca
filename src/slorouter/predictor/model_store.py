"""Model files: one file per model version holding the metadata and the booster together, written atomically.

Layout of a model directory:

- ``ttft-<version>.model``, ``tpot-<version>.model``: one file each, ``MAGIC``, an 8-byte big-endian header
  length, a JSON header (the ``ModelMetadata``, the model's byte count and SHA-256), then the XGBoost model
  bytes (UBJSON). Metadata and model therefore can never be seen inconsistent, and a reader verifies the
  checksum before trusting the bytes.
- ``ttft.latest``, ``tpot.latest``: a pointer file holding the current version's name.

``save`` writes the model file to a temporary name in the same directory, fsyncs it, renames it into
place, then replaces the pointer the same way (temp, fsync, rename) and fsyncs the directory: a reader sees
either the old or the new pointer, and the file it names is always complete. Older versions beyond the last
``keep`` are deleted afterwards; a reader that loses the race with that deletion re-reads the pointer.
``latest_version`` reads only the small pointer file, so polling it every few hundred ms is cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slorouter.predictor.atomic import write_atomic
from slorouter.predictor.features import ModelKind, check_kind

MAGIC = b"SLOROUTER-MODEL/1\n"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HEADER_LIMIT = 1 << 20
# A 200-tree, depth-6 model is about 1 MiB; a file this large is not one of ours.
MAX_MODEL_BYTES = 256 << 20
_POINTER_LIMIT = 256


class ModelFileError(ValueError):
    """Bytes that are not a complete, intact model file."""


@dataclass(slots=True)
class ModelMetadata:
    """What is stored with every model."""

    kind: ModelKind
    version: str
    trained_at: float  # unix time
    sample_count: int  # samples the model was trained on
    metrics: dict[str, Any]  # hold-out metrics (see trainer.holdout_metrics)
    schema: dict[str, Any]  # FeatureSchema.to_dict()
    objective: str  # "conformal" | "quantile" | "mean"
    quantile: float | None
    target_transform: str = "identity"  # "log": the booster predicts log(ms)
    offset: float = 0.0  # added to the booster's margin (the conformal p-quantile offset, in log space)
    baseline: dict[str, Any] | None = None  # the linear load baseline under the trees (see baseline.py)
    pool_shape: dict[str, Any] | None = None  # PoolShape.to_dict() of the pool it learnt on, if known
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelMetadata:
        try:
            meta = cls(
                kind=check_kind(data["kind"]),
                version=str(data["version"]),
                trained_at=float(data["trained_at"]),
                sample_count=int(data["sample_count"]),
                metrics=dict(data.get("metrics") or {}),
                schema=dict(data["schema"]),
                objective=str(data["objective"]),
                quantile=None if data.get("quantile") is None else float(data["quantile"]),
                target_transform=str(data.get("target_transform", "identity")),
                offset=float(data.get("offset", 0.0)),
                baseline=None if data.get("baseline") is None else dict(data["baseline"]),
                pool_shape=None if data.get("pool_shape") is None else dict(data["pool_shape"]),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"invalid model metadata: {exc!r}") from None
        if meta.target_transform not in ("identity", "log"):
            raise ModelFileError(f"unknown target_transform {meta.target_transform!r}")
        if not math.isfinite(meta.offset):
            raise ModelFileError(f"offset must be finite, got {meta.offset!r}")
        return meta


def encode_model_file(booster_raw: bytes, metadata: ModelMetadata) -> bytes:
    """The bytes of a model file (also what a training server sends for a model download)."""
    header = json.dumps(
        {
            "metadata": metadata.to_dict(),
            "model_size": len(booster_raw),
            "model_sha256": hashlib.sha256(booster_raw).hexdigest(),
        },
        separators=(",", ":"),
    ).encode()
    return b"".join((MAGIC, len(header).to_bytes(8, "big"), header, booster_raw))


def decode_model_file(data: bytes) -> tuple[bytes, ModelMetadata]:
    """Booster bytes and metadata of a model file; ``ModelFileError`` if truncated, corrupt or foreign."""
    view = memoryview(data)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise ModelFileError("not a slorouter model file (bad magic)")
    start = len(MAGIC) + 8
    if len(data) < start:
        raise ModelFileError("truncated model file (no header length)")
    header_len = int.from_bytes(view[len(MAGIC) : start], "big")
    if header_len > _HEADER_LIMIT or len(data) < start + header_len:
        raise ModelFileError("truncated model file (header)")
    try:
        header = json.loads(bytes(view[start : start + header_len]))
        size, digest = int(header["model_size"]), str(header["model_sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"corrupt model file header: {exc!r}") from None
    raw = bytes(view[start + header_len :])
    if len(raw) != size:
        raise ModelFileError(f"truncated model file: {len(raw)} of {size} model bytes")
    if hashlib.sha256(raw).hexdigest() != digest:
        raise ModelFileError("model file checksum mismatch")
    return raw, ModelMetadata.from_dict(header["metadata"])


class ModelStore:
    """A directory of versioned model files with a current-version pointer per kind."""

    def __init__(
        self, directory: str | Path, *, keep: int = 3, max_model_bytes: int = MAX_MODEL_BYTES
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if max_model_bytes < 1:
            raise ValueError(f"max_model_bytes must be >= 1, got {max_model_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._root = self.directory.resolve()
        self.keep = keep
        self.max_model_bytes = max_model_bytes

    def _read_inside(self, path: Path, limit: int) -> bytes:
        """The bytes of ``path``, which must resolve inside the directory (a symlink out of it is refused) and
        be a regular file of at most ``limit`` bytes: checked before reading it. ``FileNotFoundError`` if
        it does not exist; ``ModelFileError`` otherwise."""
        resolved = path.resolve(strict=True)
        if not resolved.is_relative_to(self._root):
            raise ModelFileError(
                f"{path.name} resolves outside the model directory {self._root}, to {resolved}"
            )
        # O_NONBLOCK: opening a FIFO planted there must not hang the loader.
        fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ModelFileError(f"{path.name} is not a regular file")
            if info.st_size > limit:
                raise ModelFileError(
                    f"{path.name} is {info.st_size} bytes, over the limit of {limit} (max_model_bytes)"
                )
            data = file.read(limit + 1)
        if len(data) > limit:  # grew while being read
            raise ModelFileError(f"{path.name} is over the limit of {limit} bytes (max_model_bytes)")
        return data

    def _model_path(self, kind: str, version: str) -> Path:
        return self.directory / f"{kind}-{version}.model"

    def _pointer_path(self, kind: str) -> Path:
        return self.directory / f"{kind}.latest"

    def save(self, kind: ModelKind, booster_raw: bytes, metadata: ModelMetadata) -> str:
        """Store a model and make it current; returns its version (``metadata.version``)."""
        check_kind(kind)
        if metadata.kind != kind:
            raise ValueError(f"metadata is for {metadata.kind!r}, not {kind!r}")
        version = metadata.version
        if not _VERSION_RE.match(version):
            raise ValueError(f"invalid model version {version!r} (letters, digits, '.', '_', '-')")
        write_atomic(self._model_path(kind, version), encode_model_file(booster_raw, metadata))
        write_atomic(self._pointer_path(kind), version.encode())
        self._prune(kind, version)
        return version

    def retire(self, kind: ModelKind) -> None:
        """Leave ``kind`` without a current version (its pointer is removed; the model files stay until
        pruned): a model shown wrong for this pool is not taken over again at the next start."""
        with contextlib.suppress(FileNotFoundError):
            self._pointer_path(check_kind(kind)).unlink()

    def latest_version(self, kind: ModelKind) -> str | None:
        """The current version of ``kind`` (None before the first save). One small file read."""
        try:
            pointer = self._read_inside(self._pointer_path(check_kind(kind)), _POINTER_LIMIT)
        except (FileNotFoundError, ModelFileError):
            return None  # an unusable pointer is no current version
        version = pointer.decode("ascii", "replace").strip()
        return version if _VERSION_RE.match(version) else None

    def read_file(self, kind: ModelKind) -> tuple[str, bytes] | None:
        """The current version of ``kind`` and its model-file bytes (as ``encode_model_file`` made them).

        ``ModelFileError`` for a file that resolves outside the directory, is not a regular file or is larger
        than ``max_model_bytes``."""
        for _ in range(5):
            version = self.latest_version(kind)
            if version is None:
                return None
            try:
                return version, self._read_inside(self._model_path(kind, version), self.max_model_bytes)
            except FileNotFoundError:
                continue  # pruned between reading the pointer and opening the file: read the pointer again
        return None

    def load(self, kind: ModelKind) -> tuple[bytes, ModelMetadata] | None:
        """Booster bytes and metadata of the current ``kind`` model (None before the first save)."""
        found = self.read_file(kind)
        if found is None:
            return None
        version, data = found
        raw, metadata = decode_model_file(data)
        if metadata.version != version or metadata.kind != kind:
            raise ModelFileError(f"{kind}-{version}.model holds {metadata.kind} version {metadata.version}")
        return raw, metadata

    def versions(self, kind: ModelKind) -> list[str]:
        """Versions of ``kind`` on disk, oldest first."""
        prefix = f"{check_kind(kind)}-"
        found = []
        for path in self.directory.glob(f"{prefix}*.model"):
            try:
                found.append((path.stat().st_mtime_ns, path.name[len(prefix) : -len(".model")]))
            except FileNotFoundError:
                continue
        return [version for _, version in sorted(found)]

    def _prune(self, kind: ModelKind, current: str) -> None:
        old = [v for v in self.versions(kind) if v != current]
        for version in old[: max(0, len(old) - (self.keep - 1))]:
            with contextlib.suppress(FileNotFoundError):
                self._model_path(kind, version).unlink()
        for tmp in self.directory.glob(f".{kind}*.tmp"):  # left behind by a writer that crashed
            with contextlib.suppress(FileNotFoundError):
                if tmp.stat().st_mtime < os.path.getmtime(self._pointer_path(kind)) - 60:
                    tmp.unlink()
