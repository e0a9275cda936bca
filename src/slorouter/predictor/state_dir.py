"""Where the predictor keeps what survives a restart, and the lock that gives one process a state directory.

The default is per user, under the XDG base directory for state: ``$XDG_STATE_HOME/slorouter/<name>`` when
``XDG_STATE_HOME`` is an absolute path, else ``~/.local/state/slorouter/<name>``. A router's default is one
level further down, keyed by its configuration file (``state_key``), so that routers of two configurations
(two pools) never share one (docs/design/state-directory.md). A state directory holds ``models/`` (the
``ModelStore``), ``samples.window`` (the ``sample_window`` file) and ``lock``.

Two processes writing one state directory would overwrite each other's models and samples (and one would
serve the other's models), so a process holds an exclusive ``flock`` on ``lock`` while it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from pathlib import Path

MODELS = "models"
SAMPLE_WINDOW = "samples.window"
LOCK = "lock"
EMBEDDED_KEY = "embedded"  # the key of a router run without a configuration file (the embedded default)
# Saved models and windows older than this are refused at start (``max_state_age_s``). A day: a router
# restarted within it (a deploy, a crash, a laptop the next morning) keeps its state; older state is from a
# run that is over, under the traffic and the pool of then, and a cold start costs only the first
# min_samples requests routed by heuristics.
DEFAULT_MAX_AGE_S = 24 * 3600.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def state_key(config_path: str | Path | None) -> str:
    """The key of a router's default state directory: ``embedded`` without a configuration file, else the
    file's name (without suffix) and 8 hex digits of the SHA-256 of its absolute, resolved path, e.g.
    ``predicted-latency-1a2b3c4d``: readable, and distinct for two files of the same name."""
    if config_path is None:
        return EMBEDDED_KEY
    path = Path(config_path).expanduser().resolve()
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:8]
    stem = _UNSAFE.sub("_", path.stem)[:40].strip("._") or "config"
    return f"{stem}-{digest}"


def default_state_dir(name: str, key: str | None = None) -> Path:
    """The per-user state directory of component ``name`` (``serve``, ``epp``, ``training-server``), under
    ``key`` when given (a router's ``state_key``)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    directory = root / "slorouter" / name
    return directory if key is None else directory / key


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
                f"state directory {directory} is in use by another slorouter process (pid {holder}): "
                "stop that process, or give this one another state directory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
