"""Child processes in tests: a free port, ``slorouter`` started as a command, its output read and its
listening socket awaited with a bound on the wait, and stopping it."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

CLI = [sys.executable, "-m", "slorouter.cli"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(*argv: str) -> subprocess.Popen[str]:
    """``slorouter ARGV...`` with its stdout and stderr piped (text)."""
    return subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    """Signal ``process`` (if it still runs), wait for it and read its pipes (killed after 20 s); its exit
    status."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
    return process.returncode


def stop_cleanly(process: subprocess.Popen[str]) -> str:
    """SIGTERM ``process`` and assert that it exits 0 within 20 s; its stderr."""
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, stderr[-2000:]
    return stderr


def stop_all(processes: list[subprocess.Popen[Any]]) -> None:
    """Terminate the processes, the last started first, and wait for each (killed if it will not stop)."""
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def wait_listening(port: int, process: subprocess.Popen[Any], timeout_s: float = 30.0) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``; fail if ``process`` exits first (with
    its stderr's end, when it is piped) or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr = process.communicate()[1] if process.stderr is not None else ""
            raise AssertionError(f"{process.args!r} exited with {process.returncode}: {stderr[-2000:]!r}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listened on port {port} in time")


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
