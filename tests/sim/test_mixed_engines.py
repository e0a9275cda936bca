"""A mixed-engine pool end to end: simulated pods serving vLLM's, SGLang's, trtllm-serve's and llama.cpp's
metric pages, scraped by the router's scraper with auto-detected and with configured dialects. Every pod's
queue, running count and KV usage must be read from its own page (no signal missing, none estimated)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from slorouter.clock import ManualClock
from slorouter.pool.config import PoolConfig, endpoints_from_config
from slorouter.pool.scraper import MetricsScraper
from slorouter.pool.state import PoolState
from slorouter.sim.profiles import get_profile
from slorouter.sim.server import start_pods
from slorouter.sim.variants import apply_variant

ENGINES = ["vllm", "sglang", "trtllm", "llamacpp"]
DIALECTS = ["vllm", "sglang", "trtllm-serve", "llamacpp"]
PER_POD = 6  # requests held on each pod: 2 run (max-seqs=2), 4 wait
BOUND_S = 20.0  # a hang guard, not a speed claim


async def _hold(session: aiohttp.ClientSession, address: str, model: str) -> None:
    body = {"model": model, "prompt": "word " * 300, "max_tokens": 30_000, "stream": True}
    async with session.post(f"http://{address}/v1/completions", json=body) as response:
        async for _ in response.content.iter_any():
            pass


async def _scraped_load(config: PoolConfig, pool: PoolState) -> MetricsScraper:
    scraper = MetricsScraper.from_config(pool, ManualClock(), config)
    deadline = asyncio.get_running_loop().time() + BOUND_S
    while True:
        results = await scraper.scrape_once()
        loads = pool.columns["waiting"] + pool.columns["running"]
        if all(results.values()) and (loads == PER_POD).all():
            return scraper
        assert asyncio.get_running_loop().time() < deadline, (results, loads)
        await asyncio.sleep(0.05)


async def test_every_pod_is_read_in_its_own_dialect() -> None:
    profile = apply_variant(get_profile("llama3-8b-h100"), "max-seqs=2")
    cluster = await start_pods(len(ENGINES), 0, profile, engines=ENGINES)
    addresses = [pod.address for pod in cluster.pods]
    holds: list[asyncio.Task[None]] = []
    try:
        async with aiohttp.ClientSession() as session:
            for pod in cluster.pods:
                holds += [asyncio.create_task(_hold(session, pod.address, pod.model)) for _ in range(PER_POD)]
            detected = PoolConfig.model_validate({"endpoints": addresses})
            configured = PoolConfig.model_validate(
                {
                    "model_server_type": "vllm",  # the pool's default; the others say their own
                    "endpoints": [
                        address if engine == "vllm" else {"address": address, "model_server_type": engine}
                        for address, engine in zip(addresses, ENGINES, strict=True)
                    ],
                }
            )
            for config in (detected, configured):
                pool = PoolState(endpoints_from_config(config))
                scraper = await _scraped_load(config, pool)
                try:
                    assert [pool.metric_dialects[a].name for a in addresses] == DIALECTS
                    assert pool.columns["metrics_missing"].tolist() == [0, 0, 0, 0]  # nothing estimated
                    assert pool.columns["running"].tolist() == [2, 2, 2, 2]
                    assert pool.columns["waiting"].tolist() == [4, 4, 4, 4]
                    assert (pool.columns["kv_usage"] > 0).all()
                    for pod, address in zip(cluster.pods, addresses, strict=True):
                        # The KV fraction is the pod's own (each page carries it in its own metric).
                        expected = pod.metrics.gauges.read(cluster.pods[0]._clock.now()).kv_usage
                        assert abs(pool.value(address, "kv_usage") - expected) < 0.05
                    # The cache geometry comes through where the server exports it (not llama.cpp).
                    assert pool.columns["block_size"].tolist()[:3] == [profile.block_size] * 3
                finally:
                    await scraper.stop()
            for hold in holds:
                hold.cancel()
            for hold in holds:
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await hold
    finally:
        await cluster.close()
