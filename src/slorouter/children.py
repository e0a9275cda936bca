"""Child processes that do not outlive the process that started them.

A supervisor stops its children when it stops, but not when it is killed (SIGKILL, an OOM kill): a child
left behind keeps its ports and keeps serving. ``stop_with_parent`` is given to ``subprocess`` as
``preexec_fn``: on Linux the kernel then sends the child SIGTERM when its parent dies.
"""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl(2)


def stop_with_parent() -> None:
    """In the child, before it runs its program: SIGTERM when the parent dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
