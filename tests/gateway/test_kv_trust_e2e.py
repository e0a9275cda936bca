"""End to end: simulated pods publish KV events over real ZMQ on 127.0.0.1 and play the ``kv-events-*``
faults (drops, reordering, delays, silence) or restart under load; the router's per-pod trust follows, the
index ends equal to the pod's cache, and the status page and metrics say what happened."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import zmq

from slorouter.faults.kinds import parse_fault
from slorouter.gateway.runtime import Router
from slorouter.kvevents.publisher import ZmqEventPublisher
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_trust import TrustReason, TrustState
from slorouter.sim.engine import Engine
from slorouter.sim.faults import FAULTS
from slorouter.sim.profiles import get_profile
from slorouter.sim.server import SimCluster, SimPod, start_pods

from .conftest import eventually, start_router

pytestmark = pytest.mark.timeout(60)
MODEL = "sim-instant"
PROFILE = dataclasses.replace(get_profile("instant"), num_gpu_blocks=4096)
TRUST = {
    "kv_events_lag_threshold_ms": 300,
    "kv_events_silent_after_ms": 300,
    "kv_events_rebuild_events": 20,
    "kv_events_rebuild_ms": 600_000,  # rebuilt by events only: no race with the wall clock
    "kv_events_replay_timeout_ms": 300,
    "kv_events_reconnect_ms": 50,
}
_prompts = itertools.count()


def pool_of(pods: list[SimPod]) -> dict[str, Any]:
    endpoints = []
    for pod in pods:
        assert pod.kv_events is not None
        publisher = pod.kv_events.publisher
        kv_events = {"endpoint": publisher.endpoint, "replay_endpoint": publisher.replay_endpoint}
        endpoints.append({"address": pod.address, "kv_events": kv_events})
    return {"endpoints": endpoints, **TRUST}


@contextlib.asynccontextmanager
async def rig(
    http: aiohttp.ClientSession, count: int = 1
) -> AsyncIterator[tuple[SimCluster, Router, KVBlockIndex]]:
    """``count`` pods that publish, a router subscribed to them, and each pod's first events in its index."""
    cluster = await start_pods(count, 0, PROFILE, kv_events_port=0)
    router = await start_router([], pool=pool_of(cluster.pods))
    try:
        index = router.core.kv_index
        assert index is not None
        await warmed(http, index, *cluster.pods)
        yield cluster, router, index
    finally:
        await router.stop()
        await cluster.close()


def inject(pod: SimPod, **fault: object) -> None:
    pod.inject(parse_fault(fault, FAULTS))


async def send(http: aiohttp.ClientSession, pod: SimPod, count: int = 1) -> None:
    """``count`` requests with prompts no pod has seen, straight to ``pod``: each stores new blocks."""
    for _ in range(count):
        prompt = f"prompt {next(_prompts)}: " + "words of a fresh prompt " * 12
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
        with contextlib.suppress(aiohttp.ClientError):  # a pod that is restarting
            async with http.post(f"http://{pod.address}/v1/completions", json=body) as response:
                await response.read()


def in_step(index: KVBlockIndex, pod: SimPod) -> bool:
    """The index holds what the pod's cache holds, and trusts it."""
    return index.trusted(pod.address) and index.num_blocks(pod.address) == len(pod.engine.kv_blocks._cached)


async def warmed(http: aiohttp.ClientSession, index: KVBlockIndex, *pods: SimPod) -> None:
    """A request to each pod, and its events in the index."""
    for pod in pods:
        await send(http, pod)
    await eventually(lambda: all(in_step(index, pod) for pod in pods))


async def serving_until(http: aiohttp.ClientSession, pod: SimPod, check: Callable[[], bool]) -> None:
    """Requests to ``pod`` one after the other until ``check`` holds (within ``eventually``'s bound)."""

    async def served() -> bool:
        await send(http, pod)
        return check()

    await eventually(served)


def entered(index: KVBlockIndex, pod: SimPod, state: TrustState, reason: TrustReason) -> int:
    trust = index.trust.get(pod.address)
    return 0 if trust is None else trust.transitions[(state, reason)]


async def rebound(endpoint: str, replay: str | None) -> ZmqEventPublisher:
    """A publisher on the ports of one just closed (ZMQ releases a port a moment after the close)."""
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        try:
            return ZmqEventPublisher(endpoint, replay, topic="", bind=True)
        except zmq.ZMQError:
            assert asyncio.get_running_loop().time() < deadline, f"{endpoint} stayed bound"
            await asyncio.sleep(0.02)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
async def one(http: aiohttp.ClientSession) -> AsyncIterator[tuple[SimPod, KVBlockIndex]]:
    """One pod, warmed, and the router's index."""
    async with rig(http) as (cluster, _, index):
        yield cluster.pods[0], index


async def test_dropped_and_reordered_batches_are_replayed_and_the_index_stays_exact(
    http: aiohttp.ClientSession, one: tuple[SimPod, KVBlockIndex]
) -> None:
    pod, index = one
    inject(pod, fault="kv-events-drop", probability=0.3)
    inject(pod, fault="kv-events-reorder", probability=0.3)
    await send(http, pod, 40)
    pod.faults.clear()
    await send(http, pod)  # a batch after the last fault shows any gap left
    await eventually(lambda: in_step(index, pod))
    stats = index.pod_stats(pod.address)
    assert stats.gaps > 0 and stats.replays == stats.gaps and stats.unrecovered == 0
    assert stats.late > 0 and stats.restarts == 0
    assert entered(index, pod, TrustState.DEGRADED, TrustReason.GAP) == stats.gaps
    assert entered(index, pod, TrustState.REBUILDING, TrustReason.UNRECOVERED_GAP) == 0


async def test_a_batch_lost_for_good_rebuilds_the_pod_on_the_approximate_estimate_meanwhile(
    http: aiohttp.ClientSession,
) -> None:
    async with rig(http, 2) as (cluster, router, index):
        pod, other = cluster.pods
        inject(pod, fault="kv-events-drop", replayable=0, count=1)
        await send(http, pod, 2)  # the first one's batch is lost; the second's shows the gap
        await eventually(lambda: index.trust_of(pod.address).state is TrustState.REBUILDING)  # type: ignore[union-attr]
        assert not index.trusted(pod.address) and index.trusted(other.address)
        status = await (await http.get(f"http://{router.address}/v1/router/status")).json()
        kv_index = {e["address"]: e["kv_index"] for e in status["endpoints"]}
        assert kv_index[pod.address]["state"] == "rebuilding"
        assert kv_index[pod.address]["reason"] == "unrecovered-gap"
        assert kv_index[other.address]["state"] == "exact"
        metrics = await (await http.get(f"http://{router.address}/metrics")).text()
        assert f'slorouter_kv_index_trust{{endpoint="{pod.address}",state="rebuilding"}} 1.0' in metrics
        await serving_until(http, pod, lambda: index.trusted(pod.address))  # 20 events rebuild it
        assert entered(index, pod, TrustState.REBUILDING, TrustReason.UNRECOVERED_GAP) == 1


async def test_batches_seconds_late_degrade_the_pod_until_they_are_timely_again(
    http: aiohttp.ClientSession, one: tuple[SimPod, KVBlockIndex]
) -> None:
    pod, index = one
    inject(pod, fault="kv-events-delay", delay_s=1.0)
    await send(http, pod, 3)
    await eventually(lambda: entered(index, pod, TrustState.DEGRADED, TrustReason.LAG) > 0)
    pod.faults.clear()
    await asyncio.sleep(1.1)  # the delayed batches arrive (late)
    await serving_until(http, pod, lambda: in_step(index, pod))  # a batch in time ends the lag


async def test_events_that_stop_while_the_pod_serves_make_it_silent(
    http: aiohttp.ClientSession, one: tuple[SimPod, KVBlockIndex]
) -> None:
    pod, index = one
    inject(pod, fault="kv-events-drop", replayable=0)  # every batch, for good: no gap is ever seen

    def silent() -> bool:
        trust = index.trust_of(pod.address)
        return trust is not None and trust.reason is TrustReason.SILENT

    await serving_until(http, pod, silent)  # it serves: its prefix-cache query counter moves
    assert index.pod_stats(pod.address).gaps == 0
    assert not index.trusted(pod.address)


async def test_a_restart_the_sequence_does_not_show_is_caught_by_the_scrape_and_the_stream_relearnt(
    http: aiohttp.ClientSession, one: tuple[SimPod, KVBlockIndex]
) -> None:
    pod, index = one
    # The pod's page now shows another process while its events go on in sequence (a relay in front of
    # the engine, a subscriber that missed the restart): only the scrape can tell.
    pod.metrics.process_start_s += 60
    await eventually(lambda: entered(index, pod, TrustState.REBUILDING, TrustReason.PROCESS_RESTART) == 1)
    assert index.num_blocks(pod.address) == 0 and index.pod_stats(pod.address).restarts == 0
    await send(http, pod)  # at its next batch the subscriber replays the stream from its start
    await eventually(lambda: index.num_blocks(pod.address) == len(pod.engine.kv_blocks._cached))


async def test_a_pod_restarted_under_load_is_cleared_rebuilt_and_ends_equal_to_its_new_cache(
    http: aiohttp.ClientSession,
) -> None:
    async with rig(http) as (cluster, _, index):
        old = cluster.pods[0]
        host, port = old.address.rsplit(":", 1)
        assert old.kv_events is not None
        publisher = old.kv_events.publisher
        endpoints = (publisher.endpoint, publisher.replay_endpoint)
        current = old
        stop = asyncio.Event()

        async def load() -> None:
            while not stop.is_set():
                await send(http, current)
                await asyncio.sleep(0.005)

        loader = asyncio.create_task(load())
        try:
            await asyncio.sleep(0.1)
            await old.close()
            new = SimPod(old.name, Engine(PROFILE, seed=5), old.model)
            new.publish_kv_events(await rebound(*endpoints))  # before it serves: it publishes every block
            await new.start(host, int(port))
            cluster.pods[0] = current = new
            restarts = (TrustReason.SEQUENCE_RESTART, TrustReason.PROCESS_RESTART)
            await eventually(
                lambda: any(entered(index, new, TrustState.REBUILDING, reason) for reason in restarts)
            )
        finally:
            stop.set()
            await loader
        await serving_until(http, current, lambda: index.trusted(current.address))  # rebuilt by its events
        await eventually(lambda: in_step(index, current))
