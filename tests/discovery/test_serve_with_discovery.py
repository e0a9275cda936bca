"""``slorouter serve``'s router with ``pool.kubernetes``: simulated pods found through an InferencePool are
scraped and served; a pod that stops being Ready stops getting requests."""

from __future__ import annotations

import math
from pathlib import Path

import aiohttp

from slorouter.config import parse_config
from slorouter.gateway.runtime import Router
from slorouter.sim.server import start_pods
from tests.discovery.conftest import eventually
from tests.kube_apiserver import FakeKubeApiServer, inference_pool, pod


async def test_the_router_serves_the_pods_its_inference_pool_selects(
    apiserver: FakeKubeApiServer, kubeconfig: Path
):
    cluster = await start_pods(2, 0, "llama3-8b-h100", seed=1)
    ports = sorted(int(address.rsplit(":", 1)[1]) for address in cluster.addresses)
    # One pod, two model servers on it (the InferencePool's two target ports), all on loopback.
    apiserver.create("inferencepools", inference_pool("llama", {"app": "sim"}, ports))
    apiserver.create("pods", pod("sim-0", "127.0.0.1", labels={"app": "sim"}))
    config = parse_config(
        {
            "gateway": {"host": "127.0.0.1", "port": 0},
            "pool": {
                "scrape_interval_ms": 20,
                "kubernetes": {
                    "namespace": "default",
                    "inference_pool": "llama",
                    "kubeconfig": str(kubeconfig),
                    "backoff_initial_ms": 20,
                },
            },
            "seed": 7,
        }
    )
    router = Router.build(config)
    try:
        await router.start()
        assert sorted(e.address for e in router.pool.endpoints) == sorted(cluster.addresses)
        assert all(e.name == "sim-0" for e in router.pool.endpoints)
        await eventually(
            lambda: all(router.pool.value(a, "metrics_time") > -math.inf for a in cluster.addresses),
            what="discovered endpoints scraped",
        )
        body = {"model": cluster.model, "prompt": "Hello there", "max_tokens": 3}
        url = f"http://{router.address}/v1/completions"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body) as resp:
                assert resp.status == 200
                assert resp.headers["x-slorouter-endpoint"] in cluster.addresses
            apiserver.update("pods", pod("sim-0", "127.0.0.1", labels={"app": "sim"}, ready=False))
            await eventually(lambda: len(router.pool) == 0, what="NotReady pod left the pool")
            async with http.post(url, json=body) as resp:
                assert resp.status == 503
    finally:
        await router.stop()
        await cluster.close()
