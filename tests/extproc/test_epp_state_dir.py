"""``slorouter epp --state-dir``: the embedded predictor's state where the flag says (one directory per
worker under it), and a clear error when the configuration has no embedded predictor."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.processes import free_port, spawn, stop, wait_for_line

pytestmark = pytest.mark.processes

READY = "slorouter epp listening on grpc://"


def _config(directory: Path, predictor: bool) -> Path:
    path = directory / "epp.yaml"
    config: dict[str, object] = {"pool": {"endpoints": ["127.0.0.1:1"]}}
    if predictor:
        config["predictor"] = {"mode": "embedded"}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _argv(config: Path, *extra: str) -> list[str]:
    return [
        "epp", "--config", str(config), "--grpc-port", str(free_port()), "--grpc-health-port",
        str(free_port()), "--metrics-port", "0", "--log-level", "WARNING", "--drain-timeout", "1", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one process", "workers"])
def test_the_state_goes_where_the_flag_says(tmp_path: Path, workers: list[str]) -> None:
    state = tmp_path / "state"
    epp = spawn(*_argv(_config(tmp_path, predictor=True), "--state-dir", str(state), *workers))
    try:
        wait_for_line(epp, READY if not workers else "workers")
        locks = sorted(p.relative_to(state).as_posix() for p in state.rglob("lock"))
    finally:
        assert stop(epp) == 0
    assert locks == (["lock"] if not workers else ["worker-0/lock", "worker-1/lock"])


def test_state_dir_needs_an_embedded_predictor(tmp_path: Path) -> None:
    epp = spawn(*_argv(_config(tmp_path, predictor=False), "--state-dir", str(tmp_path / "state")))
    _, err = epp.communicate(timeout=60)
    assert epp.returncode == 2
    assert "--state-dir: this router has no embedded predictor (its config has no predictor section)" in err


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    epp = spawn(*_argv(_config(tmp_path, predictor=False), "--workers", "2"))
    try:
        wait_for_line(epp, "workers")
        listing = subprocess.run(["pgrep", "-P", str(epp.pid)], capture_output=True, text=True, check=False)
        workers = [int(pid) for pid in listing.stdout.split()]
        assert len(workers) == 2
        epp.kill()
        epp.wait(timeout=20)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop(epp)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
