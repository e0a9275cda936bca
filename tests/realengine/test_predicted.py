"""Predicted-latency routing on real latencies: ``slorouter serve`` with examples/predicted-latency.yaml (its
scheduler and objectives as shipped; the pool, the port and a smaller training threshold replaced) in front
of three llama-servers. The embedded predictor trains on the TTFT and TPOT the router observes, and the
routes go from the warm-up ``fallback`` to ``predicted``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realengine.conftest import LlamaServer, completion, idle, post, real_gateway, requires_engine
from tests.realengine.conftest import router_inflight as inflight
from tests.reliability.conftest import GatewayProcess, http, wait_until

pytestmark = [requires_engine, pytest.mark.timeout(240), pytest.mark.processes]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "predicted-latency.yaml"
# The example trains on 200 samples every 5 s with 200 trees; 40 samples, 0.5 s and 30 trees keep this short.
TRAINING = {
    "persist": False,
    "min_samples": 40,
    "retrain_interval_s": 0.5,
    "n_estimators": 30,
    "max_depth": 4,
}


@pytest.fixture(scope="module")
def gateway(engines: list[LlamaServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    example: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    predictor = example["predictor"]
    predictor["embedded"] = {**predictor["embedded"], **TRAINING}
    del example["gateway"], example["pool"]
    process = real_gateway(tmp_path_factory.mktemp("predicted"), engines, **example).start()
    try:
        yield process
    finally:
        process.stop()


def status(gateway: GatewayProcess) -> dict[str, Any]:
    code, _, body = http("GET", f"{gateway.url}/v1/router/status")
    assert code == 200, body
    return dict(yaml.safe_load(body))


def test_the_predictor_trains_on_real_latencies_and_routing_switches_to_predicted(
    gateway: GatewayProcess, engines_up: list[LlamaServer]
):
    """Requests of varied prompt lengths and output limits, four at a time, streamed and not: the first
    are routed by the fallback (``x-slorouter-fallback-reason`` says why); once the predictor has its
    samples it is ready, and requests are routed by prediction, each answer carrying the TTFT predicted for
    it, all served."""
    wait_until(lambda: all(gateway.healthy(s.address) for s in engines_up), 15, "every endpoint healthy")
    routes: list[tuple[str, str | None]] = []
    failures: list[Any] = []
    lock = threading.Lock()

    def client(index: int, stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            words = "word " * (4 + 37 * ((index + n) % 6))
            body = completion(
                f"Request {index}-{n}. {words}", max_tokens=2 + (index + n) % 6, stream=n % 2 == 0
            )
            reply = post(gateway.address, "/v1/completions", body)
            with lock:
                if not reply.ok:
                    failures.append((reply.status, reply.body, reply.events[-2:]))
                routes.append(
                    (reply.headers["x-slorouter-route"], reply.headers.get("x-slorouter-fallback-reason"))
                )

    stop = threading.Event()
    threads = [threading.Thread(target=client, args=(i, stop)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: status(gateway)["predictor"]["ready"], 150, "the embedded predictor trained")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not failures, failures[:3]
    assert routes[0][0] == "fallback" and routes[0][1], routes[:3]

    predicted: list[dict[str, str]] = []
    for i in range(20):  # bounded: after training, the pipeline routes by prediction (explore: 1 %)
        reply = post(gateway.address, "/v1/completions", completion(f"After training {i}", max_tokens=3))
        assert reply.ok, reply.body
        if reply.headers["x-slorouter-route"] == "predicted":
            predicted.append(reply.headers)
            if len(predicted) == 3:
                break
    assert len(predicted) == 3, "routing did not switch to predicted"
    assert all(float(h["x-slorouter-predicted-ttft-ms"]) > 0 for h in predicted)
    page = status(gateway)
    assert page["routes"].get("predicted", 0) >= 3 and page["routes"]["fallback"] >= 1
    # Learned from this machine's llama-servers: the predicted TTFT is of the order of the observed one.
    pairs = [
        (e["predicted_ttft_ms"], e["observed_ttft_ms"]) for e in page["endpoints"] if e["predicted_ttft_ms"]
    ]
    assert pairs and all(observed / 20 < predicted < observed * 20 for predicted, observed in pairs), pairs
    wait_until(lambda: inflight(gateway) == 0, 15, "the router's in-flight count back to 0")
    wait_until(lambda: idle(engines_up), 30, "every llama-server slot free")
