"""``slorouter serve`` beside another router on one machine: a taken port or state directory stops it at
once, before its pods start, with what to do; ``--state-dir`` and ``--port`` let a second one run."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slorouter.predictor.state_dir import LOCK, StateDirLock
from tests.helpers.processes import stop_cleanly, wait_for_line
from tests.helpers.serve import complete

pytestmark = pytest.mark.processes

SERVE = [sys.executable, "-m", "slorouter.cli", "serve"]


def run_serve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVE, *argv], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def test_a_taken_port_stops_serve_before_its_pods_start_and_names_the_flag(taken_port: int) -> None:
    done = run_serve("--port", str(taken_port))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"slorouter: 127.0.0.1:{taken_port} is already in use by another process (another slorouter?): "
        "stop it, or give this one another port with --port N (gateway.port in the config)"
    )
    assert "embedded pool" not in done.stderr and "Traceback" not in done.stderr


def test_a_taken_state_directory_stops_serve_before_its_pods_start_and_names_the_flag(
    tmp_path: Path,
) -> None:
    lock = StateDirLock(tmp_path / "state")
    try:
        done = run_serve("--port", "0", "--state-dir", str(tmp_path / "state"))
    finally:
        lock.release()
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"slorouter: state directory {tmp_path / 'state'} is in use by another")
    assert last.endswith("(--state-dir DIR, or predictor.embedded.state_dir in the config)")
    assert "embedded pool" not in done.stderr and "Traceback" not in done.stderr


def test_state_dir_needs_an_embedded_predictor() -> None:
    done = run_serve("--config", "examples/serve.yaml", "--state-dir", "/tmp/unused")
    assert done.returncode == 2
    assert "--state-dir: this router has no embedded predictor (its config has no predictor section)" in (
        done.stderr
    )


def test_two_embedded_routers_run_side_by_side_with_their_own_state(tmp_path: Path) -> None:
    processes = []
    try:
        for name in ("first", "second"):
            process = subprocess.Popen(
                [*SERVE, "--port", "0", "--state-dir", str(tmp_path / name), "--log-level", "WARNING"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            processes.append(process)
            line, _ = wait_for_line(process, "routing on http://")
            route, _ = complete(line.split("http://", 1)[1].split()[0])
            assert route in {"fallback", "predicted", "explore"}
            assert (tmp_path / name / LOCK).is_file()
    finally:
        for process in processes:
            stop_cleanly(process)
