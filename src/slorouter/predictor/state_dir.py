"""Where the predictor keeps what survives a restart, and the lock that gives one process a state directory.

The default is per user, under the XDG base directory for state: ``$XDG_STATE_HOME/slorouter/<name>`` when
``XDG_STATE_HOME`` is an absolute path, else ``~/.local/state/slorouter/<name>``. A state directory holds
``models/`` (the ``ModelStore``), ``samples.window`` (the ``sample_window`` file) and ``lock``.

Two processes writing one state directory would overwrite each other's models and samples (and one would
serve the other's models), so a process holds an exclusive ``flock`` on ``lock`` while it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

MODELS = "models"
SAMPLE_WINDOW = "samples.window"
LOCK = "lock"


def default_state_dir(name: str) -> Path:
    """The per-user state directory of component ``name`` (``serve``, ``training-server``)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "slorouter" / name


class StateDirBusyError(OSError):
    """Another process holds the state directory."""


class StateDirLock:
    """An exclusive, non-blocking lock on ``<directory>/lock``, released by ``release`` or at process exit."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / LOCK
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StateDirBusyError(
                f"state directory {directory} is in use by another slorouter process (pid {holder}); "
                "give this one another state directory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
