from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from slorouter.sim import command
from slorouter.sim.profiles import PROFILES, get_profile


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="slorouter")
    command.register(root.add_subparsers(dest="command"))
    return root


def test_defaults():
    args = parser().parse_args(["sim"])
    assert (args.pods, args.port, args.profile, args.seed, args.host, args.model) == (
        1,
        8000,
        "llama3-8b-h100",
        0,
        "127.0.0.1",
        None,
    )
    assert args.func is command.run


@pytest.mark.parametrize(
    "argv",
    [["--pods", "0"], ["--pods", "many"], ["--port", "70000"], ["--port", "-1"], ["--profile", "gpt-9"]],
)
def test_bad_flags_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["sim", *argv])
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_port_range_past_65535_is_an_error(capsys):
    args = parser().parse_args(["sim", "--pods", "3", "--port", "65534"])
    assert command.run(args) == 2
    assert "exceed 65535" in capsys.readouterr().err


def test_kv_events_are_off_by_default_and_their_port_range_is_checked(capsys):
    assert parser().parse_args(["sim"]).kv_events_port is None
    args = parser().parse_args(["sim", "--pods", "2", "--port", "0", "--kv-events-port", "65533"])
    assert command.run(args) == 2
    assert "KV-event ports from 65533 exceed 65535" in capsys.readouterr().err


def test_a_busy_kv_events_port_is_a_clear_error(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = parser().parse_args(
            ["sim", "--port", "0", "--profile", "instant", "--kv-events-port", str(port)]
        )
        assert command.run(args) == 1
    assert "cannot listen" in capsys.readouterr().err


def test_busy_port_is_a_clear_error(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = parser().parse_args(["sim", "--port", str(busy.getsockname()[1]), "--profile", "instant"])
        assert command.run(args) == 1
    assert "cannot listen" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("variant", "message"),
    [("turbo", "unknown variant 'turbo'"), ("chunk=0", "'chunk=0': must be at least 1")],
)
def test_bad_engine_variant_is_a_clear_error(variant, message, capsys):
    args = parser().parse_args(["sim", "--engine-variant", variant])
    assert command.run(args) == 2
    assert f"--engine-variant: engine variant '{variant}'" in (err := capsys.readouterr().err)
    assert message in err


def test_unknown_profile_lists_valid_names():
    with pytest.raises(ValueError) as error:
        get_profile("gpt-9")
    assert all(name in str(error.value) for name in PROFILES)


@pytest.mark.processes
def test_runs_until_sigterm():
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; from slorouter.cli import main; sys.exit(main())", "sim",
         "--pods", "2", "--port", "0", "--profile", "instant", "--model", "m"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout.readline().startswith("slorouter sim: 2 pod(s), profile instant, model m")
        addresses = [re.search(r"http://(\S+)", process.stdout.readline()).group(1) for _ in range(2)]
        for address in addresses:
            request = urllib.request.Request(
                f"http://{address}/v1/completions",
                data=json.dumps({"prompt": "hi", "max_tokens": 3}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert json.load(response)["usage"]["completion_tokens"] == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
