"""``slorouter top --once`` as a script runs it: against a real ``slorouter serve`` that has routed requests
by its predictions, and against addresses that are not a router."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.top.conftest import CLI, WatchedRouter

pytestmark = pytest.mark.processes


def top(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "top", *argv], capture_output=True, text=True, timeout=30)


def test_one_frame_of_a_running_gateway(watched_router: WatchedRouter):
    result = top("--once", f"http://{watched_router.address}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"slorouter top · gateway http://{watched_router.address} · up ")
    assert (
        lines[1].startswith("requests ") and " · 5xx 0 · 4xx 0 · sheds 0 · queued 0" in lines[1]
    )  # the predictor's pipeline: flow control on
    requests = int(lines[1].split()[1].replace(",", ""))
    assert requests >= 20 + 12
    assert lines[2] == f"SLO attainment 100.0% ({requests} of {requests} met)"
    assert lines[3].startswith("routes predicted ")
    assert lines[4].startswith("predictor embedded, ready · models ttft ")
    shares = []
    for pod in watched_router.pods:
        row = next(line for line in lines if pod in line)
        cells = [cell.strip() for cell in row.split("│")[1:-1]]
        endpoint, up, inflight, _queue, _running, kv, predicted, observed, coverage, picks = cells
        assert (endpoint, up, inflight) == (pod, "●", "0")
        assert kv.endswith("%") and picks.endswith("%")
        shares.append(float(picks.rstrip("%")))
        if shares[-1] > 0:
            assert predicted.endswith(" ms") and observed.endswith(" ms"), row
        assert coverage == "—" or coverage.endswith("%"), row
    assert abs(sum(shares) - 100.0) < 0.2


def test_a_page_that_is_not_a_routers_is_one_line_and_exit_1(watched_router: WatchedRouter):
    result = top("--once", watched_router.pods[0])  # a simulated model server: no status page
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"slorouter top: GET http://{watched_router.pods[0]}/v1/router/status: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_an_unreachable_router_is_one_line_and_exit_1():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        result = top("--once", address)
    assert result.returncode == 1
    assert result.stderr == (
        f"slorouter top: cannot reach http://{address}: "
        "connection refused (is it running? is this its port?)\n"
    )


def test_a_malformed_url_exits_2():
    result = top("--once", "http://gate way:80")
    assert result.returncode == 2
    assert result.stderr.startswith("slorouter top: bad URL 'http://gate way:80': expected http://HOST:PORT")
    assert result.stderr.count("\n") == 1
