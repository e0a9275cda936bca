"""End to end: ``slorouter sim`` pods publish KV events over real ZMQ on 127.0.0.1, ``slorouter serve``
subscribes, and the precise scorer sends a prompt to the pod that really holds its prefix where the
approximate index, which only knows what the router sent where, would have been wrong."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import aiohttp

from slorouter.config import load_config
from slorouter.gateway.runtime import Router
from slorouter.kvevents.sim_hash import block_hashes
from slorouter.scheduling.plugins.prefix.precise import PrecisePrefixCacheProducer
from slorouter.scheduling.prefix_blocks import prefix_block_hashes, prefix_seed
from slorouter.sim.profiles import get_profile
from slorouter.sim.server import start_pods
from slorouter.tokenizer import encode_bytes

from .conftest import eventually, start_router

MODEL = "sim-instant"
PREFIX = "".join(f"shared system prompt, sentence {i}. " for i in range(60))  # ~2,000 bytes: 31 blocks
SCHEDULER = {
    "plugins": [{"type": "precise-prefix-cache-scorer"}, {"type": "max-score-picker"}],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [{"pluginRef": "precise-prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}],
        }
    ],
}


async def complete(http: aiohttp.ClientSession, base: str, prompt: str) -> str:
    async with http.post(
        f"http://{base}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2}
    ) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return response.headers.get("x-slorouter-endpoint", base)


async def test_requests_follow_the_pods_real_cache_after_an_eviction(http: aiohttp.ClientSession) -> None:
    profile = dataclasses.replace(get_profile("instant"), num_gpu_blocks=64)  # 64 blocks: easy to evict
    cluster = await start_pods(2, 0, profile, kv_events_port=0)
    endpoints = []
    for pod in cluster.pods:
        assert pod.kv_events is not None
        publisher = pod.kv_events.publisher
        kv_events = {"endpoint": publisher.endpoint, "replay_endpoint": publisher.replay_endpoint}
        endpoints.append({"address": pod.address, "kv_events": kv_events})
    router = await start_router([], pool={"endpoints": endpoints}, scheduler=SCHEDULER)
    try:
        index = router.director.setup.plugins["precise-prefix-cache-producer"].ctx.kv_index
        producer = router.director.setup.plugins["precise-prefix-cache-producer"]
        assert isinstance(producer, PrecisePrefixCacheProducer) and index is not None
        hashes = block_hashes(encode_bytes(PREFIX + "question 1"), 16)
        # Until a pod publishes, both fall back to the approximate index; the first request goes anywhere.
        first = await complete(http, router.address, PREFIX + "question 1")
        other = next(a for a in cluster.addresses if a != first)
        await eventually(lambda: index.match(hashes, [first])[first] == len(hashes))

        # The first pod evicts the prefix (other long prompts sent to it directly, past the router), and the
        # other pod computes it (sent directly too): the router's approximate index knows neither.
        for k in range(3):
            await complete(http, first, "".join(f"unrelated {k} text {i}. " for i in range(100)))
        await complete(http, other, PREFIX + "question 0")
        await eventually(lambda: index.match(hashes, [first, other]) == {first: 0, other: len(hashes)})
        approximate_hashes = prefix_block_hashes(
            (PREFIX + "question 2").encode(), prefix_seed(MODEL), 64, 256
        )
        approximate = producer.index.match(approximate_hashes)
        assert approximate.get(first, 0) > 0 and other not in approximate  # it would pick the first pod

        assert await complete(http, router.address, PREFIX + "question 2") == other
        metrics = await (await http.get(f"http://{router.address}/metrics")).text()
        assert f'slorouter_kv_events_publishing{{endpoint="{other}"}} 1.0' in metrics
        assert "slorouter_kv_events_silent_endpoints 0.0" in metrics
    finally:
        await router.stop()
        await cluster.close()


def test_the_example_config_builds() -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "precise-prefix.yaml")
    router = Router.build(config)
    assert [s.publisher.endpoint for s in router.kv_subscribers] == [
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5559",
    ]
    assert "precise-prefix-cache-producer" in router.director.setup.plugins
