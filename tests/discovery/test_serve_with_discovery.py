"""``slorouter serve``'s router with ``pool.kubernetes``: simulated pods found through an InferencePool are
scraped and served; a pod that stops being Ready stops getting requests."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import aiohttp

from slorouter.config import parse_config
from slorouter.gateway.runtime import Router
from slorouter.kvevents.sim_hash import block_hashes
from slorouter.sim.server import SimPod, start_pods
from slorouter.tokenizer import encode_bytes
from tests.discovery.conftest import eventually
from tests.helpers.kube_apiserver import FakeKubeApiServer, inference_pool, pod


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


def prompt_for(pod: str) -> str:
    return "".join(f"system prompt of {pod}, sentence {i}. " for i in range(60))  # ~2,000 bytes: 31 blocks


PRECISE_SCHEDULER = {
    "plugins": [{"type": "precise-prefix-cache-scorer"}, {"type": "max-score-picker"}],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [{"pluginRef": "precise-prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}],
        }
    ],
}


def kv_annotated(obj: dict[str, Any], sim: SimPod) -> dict[str, Any]:
    """The pod, annotated with where its simulated engine publishes its KV events."""
    assert sim.kv_events is not None
    publisher = sim.kv_events.publisher
    assert publisher.replay_endpoint is not None
    obj["metadata"]["annotations"] = {
        "slorouter.io/kv-events-port": publisher.endpoint.rsplit(":", 1)[1],
        "slorouter.io/kv-events-replay-port": publisher.replay_endpoint.rsplit(":", 1)[1],
    }
    return obj


async def complete(http: aiohttp.ClientSession, base: str, model: str, prompt: str) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"http://{base}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return response.headers.get("x-slorouter-endpoint", base)


async def test_precise_prefix_routes_on_the_kv_events_of_discovered_pods(
    apiserver: FakeKubeApiServer, kubeconfig: Path
):
    # Two pods on one port, at two loopback IPs, each publishing its KV events on ports its annotations name.
    first = await start_pods(1, 0, "instant", host="127.0.0.1", kv_events_port=0)
    port = int(first.addresses[0].rsplit(":", 1)[1])
    second = await start_pods(1, port, "instant", host="127.0.0.2", kv_events_port=0)
    a, b = first.addresses[0], second.addresses[0]
    model = first.model
    apiserver.create("inferencepools", inference_pool("llama", {"app": "sim"}, [port]))
    apiserver.create("pods", kv_annotated(pod("sim-a", "127.0.0.1", labels={"app": "sim"}), first.pods[0]))
    apiserver.create("pods", kv_annotated(pod("sim-b", "127.0.0.2", labels={"app": "sim"}), second.pods[0]))
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
            "scheduler": PRECISE_SCHEDULER,
            "seed": 7,
        }
    )
    router = Router.build(config)
    index = router.core.kv_index
    assert index is not None
    try:
        await router.start()
        async with aiohttp.ClientSession() as http:
            # Each pod computes a prompt sent to it directly, past the router: only its KV events tell.
            await complete(http, a, model, prompt_for("a"))
            await complete(http, b, model, prompt_for("b"))
            for address, prompt in ((a, prompt_for("a")), (b, prompt_for("b"))):
                hashes = block_hashes(encode_bytes(prompt), 16)
                await eventually(
                    lambda: index.match(hashes, [address])[address] == len(hashes),  # noqa: B023
                    what=f"{address}'s events reached the index",
                )
            assert await complete(http, router.address, model, prompt_for("b")) == b
            assert await complete(http, router.address, model, prompt_for("a")) == a
            metrics = await (await http.get(f"http://{router.address}/metrics")).text()
            assert "slorouter_discovery_kv_event_subscriptions 2.0" in metrics
            assert f'slorouter_kv_events_publishing{{endpoint="{b}"}} 1.0' in metrics

            # b leaves: its subscriber stops and its blocks go; the prompt it held goes to a.
            apiserver.delete("pods", "default", "sim-b")
            await eventually(lambda: [e.address for e in router.pool.endpoints] == [a], what="b left")
            assert b not in index.addresses
            assert await complete(http, router.address, model, prompt_for("b")) == a
            metrics = await (await http.get(f"http://{router.address}/metrics")).text()
            assert "slorouter_discovery_kv_event_subscriptions 1.0" in metrics
            assert 'slorouter_discovery_endpoint_changes_total{change="removed"} 1.0' in metrics
    finally:
        await router.stop()
        await first.close()
        await second.close()
