"""Flow control in front of real engines: with every llama-server slot busy, ``slorouter serve`` holds the
requests beyond them in its own queue (docs/configuration.md, ``flowControl``) instead of sending them on,
and releases one whenever a slot frees."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.realengine.conftest import (
    SLOTS,
    LlamaServer,
    Reply,
    completion,
    idle,
    post,
    real_gateway,
    requires_engine,
)
from tests.realengine.conftest import router_inflight as inflight
from tests.reliability.conftest import GatewayProcess, http, wait_until

pytestmark = [requires_engine, pytest.mark.timeout(180)]

FLOW_CONTROL = {
    "enabled": True,
    "defaultRequestTTL": "120s",
    # Each llama-server runs SLOTS sequences at once (--parallel): the pool takes no more than theirs.
    "saturationDetector": {"maxInflightRequestsPerEndpoint": SLOTS},
}


@pytest.fixture(scope="module")
def gateway(engines: list[LlamaServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("flow-control")
    process = real_gateway(directory, engines, flowControl=FLOW_CONTROL).start()
    try:
        yield process
    finally:
        process.stop()


def test_requests_beyond_the_busy_slots_wait_in_the_router(
    gateway: GatewayProcess, engines_up: list[LlamaServer]
):
    """Half as many streams again as the pool has slots, all at once: the router releases as many as the
    pool has slots and holds the rest (its status page shows them queued, their answers carry
    ``x-slorouter-queued-ms``), each released when a stream ends; every request is served, and the router
    never has more requests in flight than the pool's slots. (The release is the pool's; which server a
    released request goes to is the scheduler's pick, so one server may get more than its slots while
    another has one free: llama-server then defers it, ``llamacpp:requests_deferred``.)"""
    wait_until(lambda: all(gateway.healthy(s.address) for s in engines_up), 15, "every endpoint healthy")
    slots = SLOTS * len(engines_up)
    requests = slots + slots // 2
    peaks: dict[str, float] = {"queued": 0, "inflight": 0, "processing": 0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            code, _, body = http("GET", f"{gateway.url}/v1/router/status")
            page: dict[str, Any] = json.loads(body) if code == 200 else {}
            peaks["queued"] = max(peaks["queued"], page.get("queued") or 0)
            inflight = sum(endpoint["inflight_requests"] for endpoint in page.get("endpoints", []))
            peaks["inflight"] = max(peaks["inflight"], inflight)
            for server in engines_up:
                peaks["processing"] = max(peaks["processing"], server.processing())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(requests) as pool:
            bodies = [
                completion(f"Story {i}: once upon a time", max_tokens=32, stream=True)
                for i in range(requests)
            ]
            replies: list[Reply] = list(
                pool.map(lambda body: post(gateway.address, "/v1/completions", body), bodies)
            )
    finally:
        done.set()
        watcher.join(timeout=30)
    assert all(reply.ok for reply in replies), [
        (r.status, r.body, r.events[-2:]) for r in replies if not r.ok
    ]
    waited = [float(reply.headers["x-slorouter-queued-ms"]) for reply in replies]
    assert sum(1 for ms in waited if ms > 0) >= requests - slots, waited
    assert peaks["queued"] >= 1, peaks
    assert peaks["processing"] == SLOTS, peaks  # every slot of a server busy at once
    assert peaks["inflight"] <= slots, peaks
    outcomes = gateway.metric("slorouter_flow_control_requests_total")
    assert sum(v for k, v in outcomes.items() if 'outcome="dispatched"' in k) >= requests, outcomes
    wait_until(lambda: inflight(gateway) == 0, 15, "the router's in-flight count back to 0")
    wait_until(lambda: idle(engines_up), 30, "every llama-server slot free")
