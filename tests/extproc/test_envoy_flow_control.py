"""Flow control through a real Envoy and ``slorouter epp`` (separate processes), on both response paths
(observed, in-band): the Envoy stream is held while the request waits in the picker's queue, a queued
request is served once a slot frees, a client that leaves while queued is dropped at once and never sent
upstream, and the queue's limit (429) and TTL (503) answer through Envoy with the gateway's JSON errors.

Each picker has one simulated pod and lets one request in flight on it
(``saturationDetector.maxInflightRequestsPerEndpoint: 1``); the pod's ``hang`` fault holds that request
until its client goes away, so nothing here depends on how fast the machine is. After every test the
queue, the in-flight count and the open ext_proc streams are back to zero.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from slorouter.extproc.envoy import EnvoySetup
from tests.gateway.conftest import eventually
from tests.helpers.epp import (
    Picker,
    Sim,
    metric_sum,
    metrics_page,
    requires_envoy,
    start_envoy,
    start_epp,
    start_sim,
)
from tests.helpers.processes import free_port, stop_all

pytestmark = [pytest.mark.processes, requires_envoy]

PATHS = ("observed", "in-band")
QUEUE_SIZE = "slorouter_flow_control_queue_size{"
INFLIGHT = "slorouter_inflight_requests{"
STREAMS = "slorouter_extproc_streams "


@dataclass
class FlowPicker:
    picker: Picker
    pod: str
    envoys: dict[str, str]  # response path -> Envoy's URL


@dataclass
class FlowWorld:
    sim: Sim
    held: FlowPicker  # the queue's TTL is long: requests wait until the test frees the slot
    expiring: FlowPicker  # the queue's TTL is short: a queued request gets its 503


def _flow_config(pod: str, gateway_port: int, ttl: str) -> dict[str, Any]:
    return {
        "gateway": {"host": "127.0.0.1", "port": gateway_port},
        "pool": {"endpoints": [pod], "scrape_interval_ms": 20},
        "flowControl": {
            "enabled": True,
            "maxRequests": 1,
            "defaultRequestTTL": ttl,
            "saturationDetector": {"maxInflightRequestsPerEndpoint": 1},
        },
        "seed": 7,
    }


@pytest.fixture(scope="module")
def flow_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowWorld]:
    processes: list[subprocess.Popen[Any]] = []
    try:
        sim = start_sim(2)
        processes.append(sim.process)
        pickers = []
        for name, pod, ttl in (("held", sim.addresses[0], "60s"), ("expiring", sim.addresses[1], "400ms")):
            directory: Path = tmp_path_factory.mktemp(f"flow-{name}")
            gateway_port = free_port()
            picker = start_epp(
                _flow_config(pod, gateway_port, ttl), directory, "--envoy", "--envoy-cluster", "original_dst"
            )
            processes.append(picker.process)
            in_band = EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", picker.grpc_port,
                                 cluster="original_dst", response_path="in-band")  # fmt: skip
            envoy = start_envoy(in_band, directory)
            processes.append(envoy.process)
            envoys = {"observed": f"http://127.0.0.1:{gateway_port}", "in-band": envoy.url}
            pickers.append(FlowPicker(picker, pod, envoys))
        yield FlowWorld(sim, *pickers)
    finally:
        stop_all(processes)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def _body(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "prompt": text, "max_tokens": 3}


async def _hang(http: aiohttp.ClientSession, pod: str, on: bool) -> None:
    """The pod's ``hang`` fault on (every request that reaches it is held until its client leaves) or off."""
    if on:
        async with http.post(f"http://{pod}/admin/faults", json={"fault": "hang"}) as resp:
            assert resp.status == 200, await resp.text()
    else:
        async with http.delete(f"http://{pod}/admin/faults") as resp:
            assert resp.status == 200, await resp.text()


async def _hang_hits(http: aiohttp.ClientSession, pod: str) -> int:
    """Requests that reached the pod while its ``hang`` fault was on."""
    async with http.get(f"http://{pod}/admin/faults") as resp:
        faults = (await resp.json())["faults"]
    return sum(int(fault["hits"]) for fault in faults if fault["fault"] == "hang")


async def _wait_metric(http: aiohttp.ClientSession, picker: Picker, prefix: str, value: float) -> None:
    async def reached() -> bool:
        return metric_sum(await metrics_page(http, picker.metrics_url), prefix) == value

    await eventually(reached, timeout=20)


async def _idle(http: aiohttp.ClientSession, picker: Picker) -> str:
    """The picker's metrics once nothing is queued, nothing is in flight and no ext_proc stream is open."""
    latest = ""

    async def idle() -> bool:
        nonlocal latest
        latest = await metrics_page(http, picker.metrics_url)
        return all(metric_sum(latest, prefix) == 0 for prefix in (QUEUE_SIZE, INFLIGHT, STREAMS))

    await eventually(idle, timeout=20)
    return latest


class Holder:
    """One request that occupies the pod's only slot (the pod hangs it) until ``leave``."""

    def __init__(self, http: aiohttp.ClientSession, url: str, model: str) -> None:
        self._task = asyncio.create_task(http.post(f"{url}/v1/completions", json=_body(model, "hold")))

    async def leave(self) -> None:
        self._task.cancel()
        try:
            response = await self._task
        except asyncio.CancelledError:
            return
        response.release()
        raise AssertionError(f"the held request was answered ({response.status})")


async def _hold(http: aiohttp.ClientSession, world: FlowWorld, fp: FlowPicker, path: str) -> Holder:
    await _hang(http, fp.pod, on=True)
    holder = Holder(http, fp.envoys[path], world.sim.model)
    await _wait_metric(http, fp.picker, INFLIGHT, 1)
    return holder


@pytest.fixture
async def clean(http: aiohttp.ClientSession, flow_world: FlowWorld) -> AsyncIterator[None]:
    yield
    for fp in (flow_world.held, flow_world.expiring):
        await _hang(http, fp.pod, on=False)
        await _idle(http, fp.picker)


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("path", PATHS)
async def test_a_queued_request_is_held_then_served(
    flow_world: FlowWorld, http: aiohttp.ClientSession, path: str
) -> None:
    fp = flow_world.held
    url = fp.envoys[path]
    holder = await _hold(http, flow_world, fp, path)
    queued = asyncio.create_task(http.post(f"{url}/v1/completions", json=_body(flow_world.sim.model, "wait")))
    await _wait_metric(http, fp.picker, QUEUE_SIZE, 1)
    assert await _hang_hits(http, fp.pod) == 1  # held in the picker, not sent to the busy pod
    await _hang(http, fp.pod, on=False)
    await holder.leave()  # the slot frees: the queued request goes on
    response = await queued
    try:
        assert response.status == 200, await response.text()
        assert float(response.headers["x-slorouter-queued-ms"]) > 0
        assert response.headers["x-slorouter-endpoint"] == fp.pod
        assert response.headers["x-slorouter-route"] == "heuristic"
        assert (await response.json())["usage"]["completion_tokens"] == 3
    finally:
        response.release()
    metrics = await _idle(http, fp.picker)
    assert metric_sum(metrics, 'slorouter_flow_control_requests_total{outcome="dispatched",priority="0"') >= 1


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("path", PATHS)
async def test_a_client_that_leaves_while_queued_is_removed_and_never_sent(
    flow_world: FlowWorld, http: aiohttp.ClientSession, path: str
) -> None:
    fp = flow_world.held
    url = fp.envoys[path]
    cancelled = 'slorouter_flow_control_requests_total{outcome="cancelled",priority="0",reason="client"}'
    before = metric_sum(await metrics_page(http, fp.picker.metrics_url), cancelled)
    holder = await _hold(http, flow_world, fp, path)
    async with aiohttp.ClientSession() as impatient:
        waiting = asyncio.create_task(
            impatient.post(f"{url}/v1/completions", json=_body(flow_world.sim.model, "leave"))
        )
        await _wait_metric(http, fp.picker, QUEUE_SIZE, 1)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    # Out of the queue as soon as Envoy cancels its stream, while the slot is still taken.
    await _wait_metric(http, fp.picker, QUEUE_SIZE, 0)
    await _wait_metric(http, fp.picker, cancelled, before + 1)
    await holder.leave()
    await _idle(http, fp.picker)
    assert await _hang_hits(http, fp.pod) == 1  # only the holder ever reached the pod


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("path", PATHS)
async def test_a_full_queue_answers_429_through_envoy(
    flow_world: FlowWorld, http: aiohttp.ClientSession, path: str
) -> None:
    fp = flow_world.held
    url = fp.envoys[path]
    model = flow_world.sim.model
    holder = await _hold(http, flow_world, fp, path)
    queued = asyncio.create_task(http.post(f"{url}/v1/completions", json=_body(model, "queued")))
    try:
        await _wait_metric(http, fp.picker, QUEUE_SIZE, 1)
        async with http.post(f"{url}/v1/completions", json=_body(model, "full")) as full:
            assert full.status == 429
            assert full.headers["x-slorouter-dropped-reason"] == "queue-full"
            assert float(full.headers["x-slorouter-queued-ms"]) < 300  # refused on arrival, not held
            assert full.headers["retry-after"] == "1"
            assert full.headers["content-type"] == "application/json"
            assert "x-slorouter-endpoint" not in full.headers
            error = (await full.json())["error"]
            assert error["type"] == "RateLimitError" and "queue is full" in error["message"]
        assert await _hang_hits(http, fp.pod) == 1
    finally:
        await _hang(http, fp.pod, on=False)
        await holder.leave()
    response = await queued  # the queued one is still served
    assert response.status == 200
    response.release()
    metrics = await _idle(http, fp.picker)
    assert metric_sum(metrics, 'slorouter_flow_control_requests_total{outcome="rejected"') >= 1


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("path", PATHS)
async def test_the_queue_ttl_answers_503_through_envoy(
    flow_world: FlowWorld, http: aiohttp.ClientSession, path: str
) -> None:
    fp = flow_world.expiring
    url = fp.envoys[path]
    holder = await _hold(http, flow_world, fp, path)
    try:
        async with http.post(f"{url}/v1/completions", json=_body(flow_world.sim.model, "expire")) as expired:
            assert expired.status == 503
            assert expired.headers["x-slorouter-dropped-reason"] == "queue-ttl"
            assert float(expired.headers["x-slorouter-queued-ms"]) > 0
            assert expired.headers["retry-after"] == "1"
            error = (await expired.json())["error"]
            assert error["type"] == "ServiceUnavailableError" and "time-to-live" in error["message"]
        assert await _hang_hits(http, fp.pod) == 1  # it waited in the picker, never on the pod
    finally:
        await holder.leave()
    metrics = await _idle(http, fp.picker)
    assert metric_sum(metrics, 'slorouter_flow_control_requests_total{outcome="expired"') >= 1
