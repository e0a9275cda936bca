"""A gateway that tunes itself: the window fills from real requests, the tuner's real process answers a
round, the status page and the metrics show it; a tuner that cannot run leaves routing alone."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import pytest

from slorouter.config import ConfigError, parse_config
from slorouter.gateway.runtime import Router
from slorouter.serving.status import STATUS_PATH, decode_status
from slorouter.sim.server import SimCluster
from tests.gateway.conftest import start_router

pytestmark = pytest.mark.processes

TUNING = {
    "enabled": True,
    "interval_s": 3600,  # the test runs its rounds itself
    "window_s": 120,
    "warmup_share": 0.2,
    "min_requests": 30,
    "min_span_s": 0,
    "candidates": ["round-robin", "least-request", "token-aware"],
}


async def send(http, router: Router, cluster: SimCluster, n: int) -> None:
    async def one(i: int) -> None:
        body = {"model": cluster.model, "prompt": f"Question {i}: " + "tell me more " * 40, "max_tokens": 24}
        body["stream"] = True
        async with http.post(f"http://{router.address}/v1/completions", json=body) as response:
            assert response.status == 200
            await response.read()

    for start in range(0, n, 10):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 10, n))))


async def test_a_round_runs_in_the_tuners_process_and_shows_on_the_status_page(cluster, http):
    router = await start_router(list(cluster.addresses), tuning=TUNING)
    try:
        tuning = router.core.tuning
        assert tuning is not None and tuning.switch.active == "predicted-latency"
        tuning.switch.activate("round-robin")
        await send(http, router, cluster, 60)
        assert len(tuning.window) == 60
        count, ttfts = tuning.window.ttfts(0.0, float("inf"))  # what the switch guard reads
        assert count == 60 and len(ttfts) == 60 and all(t > 0 for t in ttfts)
        cpu_s = await tuning.round()
        assert cpu_s > 0
        async with http.get(f"http://{router.address}{STATUS_PATH}") as response:
            status = decode_status(await response.read())
        assert status.tuning is not None and status.tuning.worker == "running"
        assert status.tuning.rounds == 1 and status.tuning.last_round is not None
        last = status.tuning.last_round
        assert last["requests"] >= 30 and last["twin_error"] is not None, last
        assert set(last["twin_ttft_p90_ms"]) <= {"round-robin", "least-request", "token-aware"}
        async with http.get(f"http://{router.address}/metrics") as response:
            metrics = await response.text()
        assert "slorouter_tuning_rounds_total" in metrics and "slorouter_tuning_twin_error{" in metrics
        assert f'slorouter_tuning_active_candidate{{candidate="{status.tuning.active}"}} 1.0' in metrics
    finally:
        await router.stop()
    assert router.core.tuning is not None and router.core.tuning._process is None  # stopped with the router


async def test_a_tuner_that_cannot_run_leaves_routing_alone(cluster, http):
    router = await start_router(list(cluster.addresses), tuning=TUNING)
    try:
        tuning = router.core.tuning
        assert tuning is not None
        tuning._command = ("false",)  # a process that exits at once
        await send(http, router, cluster, 40)
        assert await tuning.round() == 0.0
        assert tuning.status().worker.startswith("down: ")
        assert tuning.switch.active == "predicted-latency"
        await send(http, router, cluster, 10)  # still routing
    finally:
        await router.stop()


@pytest.mark.parametrize(
    ("tuning", "scheduler", "message"),
    [
        ({"enabled": True}, {"plugins": [{"type": "random-picker"}]}, "no candidate-profile-handler"),
        ({"enabled": True, "candidates": ["nope"]}, None, "tuning.candidates: nope"),
        ({"enabled": True, "guard": {"period_s": 20, "watch_s": 10}}, None, "watch_s"),
        ({"enabled": True, "cpu_budget": 2}, None, "cpu_budget"),
    ],
)
def test_bad_tuning_configurations_name_the_problem(tuning: dict[str, Any], scheduler, message):
    data: dict[str, Any] = {"pool": {"endpoints": ["127.0.0.1:1"]}, "tuning": tuning}
    if scheduler is not None:
        data["scheduler"] = scheduler
    with pytest.raises(ConfigError, match=message):
        Router.build(parse_config(data))


FAKE_TUNER = """
import json, sys
sys.stdin.readline()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    result = {"outcome": "switched", "switch_to": "least-request", "reason": "test", "twin_error": 0.05,
              "errors": {"ttft_p90_ms": 0.05}, "predicted_gain": 0.2}
    print(json.dumps({"round": request["round"], "result": result, "cpu_s": 0.5}), flush=True)
"""


async def test_a_switch_takes_effect_at_once_is_logged_and_counted(cluster, http, caplog):
    router = await start_router(list(cluster.addresses), tuning=TUNING)
    try:
        tuning = router.core.tuning
        assert tuning is not None
        tuning._command = (sys.executable, "-c", FAKE_TUNER)
        await send(http, router, cluster, 40)
        with caplog.at_level(logging.INFO, logger="slorouter.tuning"):
            assert await tuning.round() == 0.5
        assert tuning.switch.active == "least-request"
        assert "tuning: switched from predicted-latency to least-request: test" in caplog.text
        assert tuning.guard.watch is not None and tuning.guard.watch.previous == "predicted-latency"
        await send(http, router, cluster, 10)
        async with http.get(f"http://{router.address}/metrics") as response:
            metrics = await response.text()
        assert 'slorouter_tuning_switches_total{by="tuner",candidate="least-request"} 1.0' in metrics
        assert 'slorouter_tuning_rounds_total{outcome="switched"} 1.0' in metrics
        assert "slorouter_tuning_predicted_gain 0.2" in metrics
    finally:
        await router.stop()
