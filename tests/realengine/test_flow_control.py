"""Flow control in front of a real engine: with every slot of a llama-server busy, ``slorouter serve``
holds the requests beyond them in its own queue (docs/configuration.md, ``flowControl``) instead of sending
them on to wait in the engine, and releases one whenever a slot frees.

One server, so that the pool's room is that server's: with several, flow control releases on the pool's
room and the scheduler picks the server, which may have none (docs/real-engine.md)."""

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

pytestmark = [requires_engine, pytest.mark.timeout(180), pytest.mark.processes]

FLOW_CONTROL = {
    "enabled": True,
    "defaultRequestTTL": "120s",
    # The llama-server runs SLOTS sequences at once (--parallel): the router sends it no more.
    "saturationDetector": {"maxInflightRequestsPerEndpoint": SLOTS},
}


@pytest.fixture(scope="module")
def gateway(engines: list[LlamaServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("flow-control")
    process = real_gateway(directory, engines[:1], flowControl=FLOW_CONTROL).start()
    try:
        yield process
    finally:
        process.stop()


def test_requests_beyond_the_busy_slots_wait_in_the_router(
    gateway: GatewayProcess, engines_up: list[LlamaServer]
):
    """Twice as many streams as the server has slots, all at once: the router releases one per slot and
    holds the others (its status page shows them queued) until streams end; the engine never has a request
    waiting for a slot (``llamacpp:requests_deferred`` stays 0) and the router never more than its slots in
    flight on it; every request is served. A held request waits for a stream of 32 tokens to end; one that
    found a free slot is on its way within a few milliseconds (``x-slorouter-queued-ms``)."""
    server = engines_up[0]
    wait_until(lambda: gateway.healthy(server.address), 15, "the endpoint healthy")
    requests = 2 * SLOTS
    peaks: dict[str, float] = {"queued": 0, "inflight": 0, "processing": 0, "deferred": 0}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            code, _, body = http("GET", f"{gateway.url}/v1/router/status")
            page: dict[str, Any] = json.loads(body) if code == 200 else {}
            peaks["queued"] = max(peaks["queued"], page.get("queued") or 0)
            for endpoint in page.get("endpoints", []):
                peaks["inflight"] = max(peaks["inflight"], endpoint["inflight_requests"])
            peaks["processing"] = max(peaks["processing"], server.processing())
            peaks["deferred"] = max(peaks["deferred"], server.metric("llamacpp:requests_deferred"))

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
    waited = sorted(float(reply.headers["x-slorouter-queued-ms"]) for reply in replies)
    assert sum(1 for ms in waited if ms >= 10) >= requests - SLOTS, waited
    assert peaks["queued"] >= 1 and peaks["processing"] == SLOTS, peaks
    assert peaks["inflight"] <= SLOTS and peaks["deferred"] == 0, peaks
    outcomes = gateway.metric("slorouter_flow_control_requests_total")
    assert sum(v for k, v in outcomes.items() if 'outcome="dispatched"' in k) >= requests, outcomes
    wait_until(lambda: inflight(gateway) == 0, 15, "the router's in-flight count back to 0")
    wait_until(lambda: idle(engines_up), 30, "every llama-server slot free")
