"""``slorouter epp --workers N``: the merged metrics page, and the supervised workers for real (shared ports,
connections spread across them, a killed worker restarted, SIGTERM drains and exits 0); picker replicas
sharing their in-flight counts over UDP (``--replica-peers``)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slorouter.extproc.workers import merge_expositions
from slorouter.pool.inflight_sharing import parse_peers
from tests.extproc.conftest import (
    DUPLEX,
    body_message,
    completion,
    headers_message,
    open_call,
    request_headers,
)
from tests.helpers.epp import start_sim
from tests.helpers.processes import free_port, spawn, stop, wait_for_lines

PAGE = """# HELP slorouter_requests_total Requests.
# TYPE slorouter_requests_total counter
slorouter_requests_total{code="200",endpoint="a"} 3.0
# HELP slorouter_inflight_requests In flight.
# TYPE slorouter_inflight_requests gauge
slorouter_inflight_requests{endpoint="a"} 1.0
# HELP lat_seconds Latency.
# TYPE lat_seconds histogram
lat_seconds_bucket{le="0.1"} 1.0
lat_seconds_bucket{le="+Inf"} 2.0
lat_seconds_count 2.0
lat_seconds_sum 0.5
"""


def test_merged_pages_label_every_sample_with_its_worker():
    merged = merge_expositions([("0", PAGE), ("1", PAGE.replace("3.0", "4.0"))]).decode()
    families = {family.name: family for family in text_string_to_metric_families(merged)}
    requests = {
        s.labels["worker"]: s.value
        for s in families["slorouter_requests"].samples
        if s.name.endswith("total")
    }
    assert requests == {"0": 3.0, "1": 4.0}
    assert families["slorouter_requests"].type == "counter"
    assert families["lat_seconds"].type == "histogram"
    assert {s.labels["worker"] for s in families["lat_seconds"].samples} == {"0", "1"}
    assert merged.count("# TYPE slorouter_inflight_requests gauge") == 1


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def _page(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        return await response.text()


async def _until(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(line) for line in out.split()]


@pytest.mark.processes
async def test_workers_share_the_ports_and_a_killed_one_is_restarted(tmp_path: Path):
    sim = start_sim(2)
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    config = {"pool": {"endpoints": sim.addresses, "scrape_interval_ms": 50}, "seed": 3}
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    epp = spawn(
        "epp", "--config", str(path), "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port),
        "--metrics-port", str(metrics_port), "--workers", "2", "--drain-timeout", "2",
        "--log-level", "WARNING",
    )  # fmt: skip
    try:
        wait_for_lines(epp, ["slorouter epp: 2 workers on grpc://"], timeout_s=60)
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        # Sixteen connections, each with an open stream: the kernel spreads them over both workers.
        channels = [
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.channel_index", i)])
            for i in range(16)
        ]
        calls = [open_call(channel) for channel in channels]
        for call in calls:
            await call.send(
                headers_message(request_headers(), request_mode=DUPLEX, response_mode=DUPLEX),
                body_message(completion(sim.model), end_of_stream=True),
            )
            await call.receive(2)  # routed: in flight until its response ends

        async def both_busy_and_shared() -> bool:
            page = await _page(url)
            streams = [_value(page, "slorouter_extproc_streams", worker=w) for w in ("0", "1")]
            # Each worker's in-flight columns hold its own requests plus the other's (the shared view).
            inflight = [_value(page, "slorouter_inflight_requests", worker=w) for w in ("0", "1")]
            return sum(streams) == 16 and min(streams) > 0 and inflight == [16, 16]

        await _until(both_busy_and_shared)
        for call in calls:
            call.call.cancel()
        for channel in channels:
            await channel.close()

        async def idle() -> bool:
            page = await _page(url)
            return (
                _value(page, "slorouter_extproc_streams") == 0
                and _value(page, "slorouter_inflight_requests") == 0
            )

        await _until(idle)
        # A worker killed is restarted, and the pod's page says so.
        victim = _children(epp.pid)[0]
        subprocess.run(["kill", "-9", str(victim)], check=True)

        async def restarted() -> bool:
            page = await _page(url)
            alive = len(_children(epp.pid)) == 2 and victim not in _children(epp.pid)
            return (
                alive
                and _value(page, "slorouter_epp_worker_restarts_total") == 1
                and (
                    _value(page, "slorouter_extproc_streams", worker="0") == 0
                    and 'worker="1"' in page
                    and 'worker="0"' in page
                )
            )

        await _until(restarted, timeout_s=60)
        workers = _children(epp.pid)
        assert stop(epp, signal.SIGTERM) == 0  # the workers drain, then the supervisor exits 0
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    finally:
        stop(epp, signal.SIGKILL)
        stop(sim.process)


@pytest.mark.processes
def test_workers_need_fixed_shared_ports(tmp_path: Path):
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump({"pool": {"endpoints": ["127.0.0.1:1"]}}), encoding="utf-8")
    for flags in (["--grpc-port", "0"], ["--grpc-health-port", "0"]):
        result = subprocess.run(
            [sys.executable, "-m", "slorouter.cli", "epp", "--config", str(path), "--workers", "2", *flags],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert result.returncode == 2 and "--workers needs fixed" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "slorouter.cli", "epp", "--config", str(path), "--workers", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "between 1 and 64" in result.stderr


pytestmark = pytest.mark.timeout(180)


def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.processes
async def test_replicas_share_their_in_flight_counts_over_udp_and_drop_a_dead_ones(tmp_path: Path):
    """Two pickers (as two pods' replicas would) list each other (and themselves) as peers: each routes
    on both's load; a replica killed is dropped from the other's view after the TTL."""
    sim = start_sim(2)
    config = {"pool": {"endpoints": sim.addresses, "scrape_interval_ms": 50}, "seed": 3}
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    udp = [_free_udp_port(), _free_udp_port()]
    peers = ",".join(f"127.0.0.1:{port}" for port in udp)
    replicas = []
    for port in udp:
        grpc_port, health, metrics_port = free_port(), free_port(), free_port()
        process = spawn(
            "epp", "--config", str(path), "--grpc-port", str(grpc_port), "--grpc-health-port", str(health),
            "--metrics-port", str(metrics_port), "--replica-peers", peers, "--replica-port", str(port),
            "--drain-timeout", "2", "--log-level", "WARNING",
        )  # fmt: skip
        replicas.append((process, grpc_port, f"http://127.0.0.1:{metrics_port}/metrics"))
    try:
        for process, _, _ in replicas:
            wait_for_lines(process, ["slorouter epp listening on"], timeout_s=60)
        (first, first_grpc, first_url), (second, second_grpc, second_url) = replicas
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for port in (first_grpc, second_grpc)]
        calls = []
        for channel, count in zip(channels, (3, 5), strict=True):
            for _ in range(count):
                call = open_call(channel)
                await call.send(
                    headers_message(request_headers(), request_mode=DUPLEX, response_mode=DUPLEX),
                    body_message(completion(sim.model), end_of_stream=True),
                )
                await call.receive(2)  # routed: in flight until its response ends
                calls.append(call)

        async def shared() -> bool:
            pages = [await _page(first_url), await _page(second_url)]
            own = [_value(page, "slorouter_extproc_streams") for page in pages]
            seen = [_value(page, "slorouter_inflight_requests") for page in pages]
            return own == [3, 5] and seen == [8, 8]  # each sees its own requests and the other's

        await _until(shared)
        stop(second, signal.SIGKILL)  # no empty publication: the first drops its load after the TTL

        async def dropped() -> bool:
            return _value(await _page(first_url), "slorouter_inflight_requests") == 3

        await _until(dropped)
        for call in calls[:3]:
            call.call.cancel()

        async def idle() -> bool:
            return _value(await _page(first_url), "slorouter_inflight_requests") == 0

        await _until(idle)
        for channel in channels:
            await channel.close()
        assert stop(first, signal.SIGTERM) == 0
    finally:
        for process, _, _ in replicas:
            stop(process, signal.SIGKILL)
        stop(sim.process)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.0.0.1", (("10.0.0.1", 9004),)),
        ("epp-peers.ns.svc:7000, 10.0.0.2", (("epp-peers.ns.svc", 7000), ("10.0.0.2", 9004))),
        ("[fd00::1]:7001,[fd00::2]", (("fd00::1", 7001), ("fd00::2", 9004))),
    ],
)
def test_replica_peers_are_parsed_with_their_ports(value: str, expected: tuple[tuple[str, int], ...]):
    assert parse_peers(value, 9004) == expected


@pytest.mark.parametrize(
    ("value", "needle"),
    [("", "no peer host"), ("host:0", "port must be 1-65535"), ("host:http", "port must be"),
     ("[fd00::1", "closing"), (":7000", "no host"), ("[fd00::1]7000", "':PORT'")],
)  # fmt: skip
def test_bad_replica_peers_are_refused_naming_the_entry(value: str, needle: str):
    with pytest.raises(ValueError, match=needle):
        parse_peers(value, 9004)


@pytest.mark.processes
def test_bad_replica_peers_stop_the_command_naming_the_flag(tmp_path: Path):
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump({"pool": {"endpoints": ["127.0.0.1:1"]}}), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "slorouter.cli", "epp", "--config", str(path), "--replica-peers", "host:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--replica-peers" in result.stderr and "1-65535" in result.stderr
