"""Atomic file replacement: a reader sees the old file or the new one, whole, never a torn mix.

The bytes go to a temporary file in the same directory, which is fsynced and renamed over the target; the
directory is fsynced afterwards so the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Replace ``path`` by ``data`` atomically (temp file, fsync, rename, then fsync of the directory)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync_dir:
        fsync_dir(path.parent)
