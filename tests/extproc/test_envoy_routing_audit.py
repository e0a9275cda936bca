"""The scores header through a real Envoy in front of ``slorouter epp`` (processes): on the observed response
path (Envoy adds it from the picker's metadata) and in-band (the picker sets it), bounded; regret on the
picker's status page."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from slorouter.extproc.envoy import EnvoySetup
from slorouter.serving.status import STATUS_PATH, decode_status
from tests.helpers.epp import Picker, Sim, requires_envoy, start_envoy, start_epp, start_sim
from tests.helpers.processes import free_port, stop_all

pytestmark = [pytest.mark.processes, requires_envoy]


@dataclass
class World:
    pods: Sim
    epp: Picker
    envoys: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("envoy-audit")
    processes: list[subprocess.Popen[Any]] = []
    try:
        pods = start_sim(3)
        processes.append(pods.process)
        gateway_port = free_port()
        config = {
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "pool": {"endpoints": pods.addresses, "scrape_interval_ms": 20},
            "audit": {"regret": True, "scores_header": True, "scores_max_candidates": 2},
            "seed": 7,
        }
        epp = start_epp(config, directory, "--envoy", "--envoy-cluster", "original_dst")
        processes.append(epp.process)
        in_band = EnvoySetup(
            "127.0.0.1",
            free_port(),
            "127.0.0.1",
            epp.grpc_port,
            cluster="original_dst",
            response_path="in-band",
        )
        envoy = start_envoy(in_band, directory)
        processes.append(envoy.process)
        yield World(pods, epp, {"observed": f"http://127.0.0.1:{gateway_port}", "in-band": envoy.url})
    finally:
        stop_all(processes)


@pytest.mark.parametrize("path", ["observed", "in-band"])
async def test_the_scores_header_through_envoy(world: World, path: str):
    body = {"model": world.pods.model, "prompt": f"Scores through {path}", "max_tokens": 2}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(f"{world.envoys[path]}/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        await resp.read()
        endpoint = resp.headers["x-slorouter-endpoint"]
        listed = [entry.split(";") for entry in resp.headers["x-slorouter-scores"].split(",")]
        assert [entry[0] for entry in listed] == [endpoint, resp.headers["x-slorouter-runner-up"]]
        assert all(entry[1].startswith("score=") and entry[-1].startswith("prefix=") for entry in listed)
        assert resp.headers["x-slorouter-scores-omitted"] == "1"


async def test_the_picker_counts_regret(world: World):
    body = {"model": world.pods.model, "prompt": "Counted", "max_tokens": 2}
    status_url = world.epp.metrics_url.replace("/metrics", STATUS_PATH)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.get(status_url) as resp:
            before = decode_status(await resp.read()).regret
        async with http.post(f"{world.envoys['in-band']}/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
        async with http.get(status_url) as resp:
            after = decode_status(await resp.read()).regret
    assert before is not None and after is not None and after.picks == before.picks + 1
