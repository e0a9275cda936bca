"""`slorouter epp`'s command line: its flags, and configuration errors as exit code 2."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from slorouter.cli import build_parser, main
from slorouter.config import parse_config
from slorouter.extproc.command import _envoy_setup, _hedges_reach_another_endpoint, message_timeout_s


def test_the_defaults():
    args = build_parser().parse_args(["epp", "--config", "x.yaml"])
    assert (args.host, args.grpc_port, args.grpc_health_port, args.metrics_port) == (
        "127.0.0.1",
        9002,
        9003,
        9090,
    )
    assert (args.envoy, args.envoy_body_mode, args.envoy_cluster, args.envoy_fail_open) == (
        False,
        "full-duplex",
        "override_host",
        False,
    )


@pytest.mark.parametrize(
    ("text", "extra", "needle"),
    [
        ("gateway: {port: 0}\n", [], "'pool' is required"),
        (
            "pool: {endpoints: ['127.0.0.1:1']}\n",
            ["--envoy", "--envoy-fail-open"],
            "--envoy-body-mode buffered",
        ),
        ("pool: {endpoints: ['127.0.0.1:1']}\nbogus: 1\n", [], "bogus"),
        (
            "pool: {endpoints: ['localhost:8000']}\n",
            ["--envoy"],
            "as ip:port, not host names: localhost:8000",
        ),
    ],
)
def test_configuration_errors_exit_2(tmp_path: Path, capsys, text: str, extra: list[str], needle: str):
    path = tmp_path / "epp.yaml"
    path.write_text(text)
    assert main(["epp", "--config", str(path), *extra]) == 2
    assert needle in capsys.readouterr().err


def test_a_bad_port_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["epp", "--config", "x", "--grpc-port", "70000"])
    assert "a port must be between 0 and 65535, got 70000" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flow_control", "expected"),
    [
        ({}, 5.0),
        ({"flowControl": {"enabled": True}}, 35.0),  # the default TTL of 30 s
        ({"flowControl": {"enabled": True, "defaultRequestTTL": "2m"}}, 125.0),
        ({"flowControl": {"enabled": True, "defaultRequestTTL": None}}, 600.0),  # the upstream timeout
    ],
)
def test_envoys_message_timeout_covers_the_queue(flow_control: dict[str, object], expected: float):
    """A request held in the flow-control queue is answered when it leaves it: the generated Envoy waits
    that long for the answer (in BUFFERED mode it would answer 504 first)."""
    config = parse_config({"pool": {"endpoints": ["10.0.0.1:8000"]}, **flow_control})
    assert message_timeout_s(config) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("cluster", "hedges"),
    [("override_host", True), ("original_dst", False)],
)
def test_the_generated_envoy_and_the_picker_follow_the_objectives_deadlines(
    caplog, cluster: str, hedges: bool
):
    config = parse_config(
        {
            "pool": {"endpoints": ["10.0.0.1:8000"]},
            "objectives": {
                "batch": {"priority": -1, "deadline": {"action": "cancel"}},
                "chat": {"priority": 1, "deadline": {"action": "hedge"}},
            },
        }
    )
    args = build_parser().parse_args(["epp", "--config", "x.yaml", "--envoy", "--envoy-cluster", cluster])
    setup = _envoy_setup(config, "127.0.0.1", 9002, args)
    assert (setup.hedges, setup.cancels) == (True, True)
    with caplog.at_level(logging.WARNING, logger="slorouter"):
        assert _hedges_reach_another_endpoint(config, args) is hedges
    assert ("no request is hedged" in caplog.text) is not hedges  # said once, at start
    plain = _envoy_setup(parse_config({"pool": {"endpoints": ["10.0.0.1:8000"]}}), "127.0.0.1", 9002, args)
    assert (plain.hedges, plain.cancels) == (False, False)
