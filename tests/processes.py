"""Reading a child process's output in tests, with a bound on the wait."""

from __future__ import annotations

import queue
import subprocess
import threading
import time


def wait_for_line(process: subprocess.Popen[str], marker: str, timeout_s: float = 30.0) -> tuple[str, float]:
    """The first stdout line of ``process`` that contains ``marker``, and the monotonic time it arrived.

    The lines are read in a thread (a select on the buffered pipe can miss lines it already read). If the
    process exits or the time runs out first, it is killed and ``AssertionError`` shows its stderr's end.
    """
    return wait_for_lines(process, [marker], timeout_s)[0]


def wait_for_lines(
    process: subprocess.Popen[str], markers: list[str], timeout_s: float = 30.0
) -> list[tuple[str, float]]:
    """The stdout lines of ``process`` that contain ``markers[0]``, then ``markers[1]`` (a later line) and so
    on, with their times (see ``wait_for_line``)."""
    lines: queue.Queue[tuple[str, float]] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put((line, time.monotonic())) for line in process.stdout or ()], daemon=True
    ).start()
    found: list[tuple[str, float]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line, at = lines.get(timeout=0.1)
        except queue.Empty:
            if process.poll() is not None:
                break
            continue
        if markers[len(found)] in line:
            found.append((line, at))
            if len(found) == len(markers):
                return found
    process.kill()
    missing = markers[len(found)]
    raise AssertionError(f"{process.args!r} did not print {missing!r}: {process.communicate()[1][-2000:]}")
