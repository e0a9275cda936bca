"""A bounded, rotating JSON Lines file written by a background thread.

``RecordFile.add(item)`` is what the request path calls: an append to a deque, nothing else. A daemon thread
wakes every ``interval_s``, turns the pending items into lines (``encode``, a batch at a time, run on the
thread, so that hashing and JSON never run on the event loop), and appends them to the file. Like logging's
``RotatingFileHandler``: when a write would take the file past ``max_bytes``, ``FILE`` becomes ``FILE.1``
(``FILE.1`` becomes ``FILE.2``, …, up to ``backups``; the oldest is deleted) and a new ``FILE`` starts, so
the files never hold more than about ``(backups + 1) × max_bytes``. Every file starts with ``header()``'s
line.

Failures never reach the caller: when more than ``max_pending`` items wait (the disk is slower than the
traffic), new ones are dropped and counted; when a write, a rename or an open fails, the error is logged
once and recording stops for good (``failed``), the items still pending are dropped.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5
DEFAULT_MAX_PENDING = 100_000
_BATCH = 1000  # items encoded at once


class RecordFile(Generic[T]):
    def __init__(
        self,
        path: Path,
        encode: Callable[[list[T]], list[str]],
        header: Callable[[], str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
        interval_s: float = 0.2,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        """``encode`` gives one line per item of a batch, ``header`` one line; without their newlines."""
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        if backups < 0:
            raise ValueError(f"backups must be at least 0, got {backups}")
        self.path = path
        self._encode = encode
        self._header = header
        self._max_bytes = max_bytes
        self._backups = backups
        self._interval_s = interval_s
        self._max_pending = max_pending
        self._pending: collections.deque[T] = collections.deque()
        self._file: int | None = None  # an O_APPEND descriptor
        self._size = 0
        self._header_bytes = 0  # a file holding only its header is never rotated
        self._lock = threading.Lock()  # one drain at a time (the thread's, or flush's)
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.written = 0  # items written
        self.dropped = 0  # items dropped: too many pending, or after a failure
        self.failed = False

    def open(self) -> None:
        """Open (append to) the file and start the writer thread. Raises ``OSError`` when the file cannot be
        opened, so that a command can refuse to start."""
        self._open_file()
        self._thread = threading.Thread(target=self._run, name=f"record {self.path.name}", daemon=True)
        self._thread.start()

    def add(self, item: T) -> None:
        """Queue one item (never blocks, never raises)."""
        if self.failed or self._stopping:
            self.dropped += 1
            return
        if len(self._pending) >= self._max_pending:
            if not self.dropped:
                log.warning(
                    "recording to %s: more than %d records wait for the disk; dropping new ones",
                    self.path,
                    self._max_pending,
                )
            self.dropped += 1
            return
        self._pending.append(item)

    def flush(self) -> None:
        """Write everything queued so far, on the calling thread (tests; ``close``)."""
        self._drain()

    def close(self) -> None:
        """Stop the thread, write what is pending, close the file."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._drain()
        if self._file is not None:
            os.close(self._file)
            self._file = None

    # --- the writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._interval_s)
            try:
                self._drain()
            except Exception as exc:  # a record that cannot be encoded: stop, never take the process down
                self._fail(OSError(f"{exc.__class__.__name__}: {exc}"))

    def _drain(self) -> None:
        """Encode what is pending and append it, in one write per file."""
        with self._lock:
            while self._pending and not self.failed:
                batch = [self._pending.popleft() for _ in range(min(len(self._pending), _BATCH))]
                lines = self._encode(batch)
                self._write(lines)

    def _write(self, lines: list[str]) -> None:
        """Append ``lines``, rotating the file before one that would take it past ``max_bytes``."""
        chunk = bytearray()
        count = 0  # lines in ``chunk``
        done = 0  # lines of ``lines`` written
        try:
            for text in lines:
                line = text.encode("utf-8") + b"\n"
                size = self._size + len(chunk)
                if size + len(line) > self._max_bytes and size > self._header_bytes:
                    self._append(chunk)
                    done += count
                    chunk.clear()
                    count = 0
                    self._rotate()
                chunk += line
                count += 1
            self._append(chunk)
            done += count
        except OSError as exc:
            self.dropped += len(lines) - done
            self._fail(exc)
        finally:
            self.written += done

    def _append(self, data: bytes | bytearray) -> None:
        if not data:
            return
        if self._file is None:
            raise OSError(f"{self.path} is not open")
        written = os.write(self._file, data)
        if written != len(data):
            raise OSError(f"short write to {self.path} ({written} of {len(data)} bytes)")
        self._size += written

    def _rotate(self) -> None:
        assert self._file is not None
        os.close(self._file)
        self._file = None
        if self._backups:
            for i in range(self._backups - 1, 0, -1):
                older = self._backup(i)
                if older.exists():
                    os.replace(older, self._backup(i + 1))
            os.replace(self.path, self._backup(1))
        else:
            os.unlink(self.path)
        self._open_file()

    def _backup(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def _open_file(self) -> None:
        self._file = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._file).st_size
        header = self._header().encode("utf-8") + b"\n"
        # Appending to an earlier recording: its header starts the part of the file that is this one's.
        os.write(self._file, header)
        self._header_bytes = len(header) if self._size == 0 else 0
        self._size += len(header)

    def _fail(self, exc: OSError) -> None:
        if not self.failed:
            log.error("recording to %s failed; recording stops, requests go on: %s", self.path, exc)
        self.failed = True
        self.dropped += len(self._pending)
        self._pending.clear()
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.close(self._file)
            self._file = None
