"""Predictor faults against the real gateway in remote-predictor mode: ``slorouter serve``, a
``slorouter predictor training-server`` and a ``prediction-server --enable-fault-injection``, and two
``slorouter sim`` pods, each a separate process on 127.0.0.1.

For each prediction-server fault (killed, hung, slow, slow tail, 5xx, malformed body, NaN and infinite
predictions): every request is still answered 200, routed by the fallback and saying why in
``x-slorouter-fallback-reason``; the circuit breaker opens (its metrics), stops the calls (neither the
client's bulk requests nor the server's faulted requests grow by more than one probe per cool-down); once
the fault is cleared the breaker closes and requests are routed by prediction again; nothing leaks. Then the
training server is stopped for a while: samples wait in the bounded queue, the overflow is counted, and
what was queued is delivered when it returns. docs/reliability.md, "Predictor faults", is the table of these
tests. Every wait is bounded; no test asserts a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.processes import free_port, wait_for_line
from tests.reliability.conftest import (
    CLI,
    GatewayProcess,
    RestartableProcess,
    http,
    start_sims,
    wait_until,
)

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

COOLDOWN_S = 0.5  # the breaker's first cool-down; it doubles up to MAX_COOLDOWN_S
MAX_COOLDOWN_S = 1.0
# Generous for a loaded CI core, where a healthy server must look neither hung nor slow (with fewer than 100
# exchanges in the window, the p99 is the slowest one), and below the scheduler's 400 ms producer budget.
TIMEOUT_MS = 350
BUDGET_MS = 200
MAX_BUFFERED = 40
PREDICTED = ("predicted", "explore")


class PredictorProcess(RestartableProcess):
    """``slorouter predictor training-server|prediction-server`` on a fixed port; killed or stopped and
    started again on the same port (the training server with the same state directory)."""

    def __init__(self, kind: str, args: list[str], log: Path) -> None:
        self.kind, self.args, self.log = kind, args, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> PredictorProcess:
        args = [*CLI, "predictor", self.kind, "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        with self.log.open("a") as log:
            self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        wait_for_line(self.process, f"listening on {self.url}")
        return self

    def fds(self) -> int:
        assert self.process is not None
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def inject(self, **fault: Any) -> None:
        status, _, body = http("POST", f"{self.url}/admin/faults", fault)
        assert status == 200, body

    def clear(self) -> None:
        status, _, body = http("DELETE", f"{self.url}/admin/faults")
        assert status == 200, body

    def hits(self) -> int:
        _, _, body = http("GET", f"{self.url}/admin/faults")
        return sum(int(f["hits"]) for f in json.loads(body)["faults"])

    def samples_added(self) -> int:
        status, _, body = http("GET", f"{self.url}/v1/status")
        assert status == 200, body
        return sum(int(model["samples_added_total"]) for model in json.loads(body)["models"].values())


@dataclass
class Stack:
    training: PredictorProcess
    prediction: PredictorProcess
    gateway: GatewayProcess

    def request(self) -> tuple[str, str | None, float]:
        """One completion through the gateway, which must succeed: its route, fallback reason, duration."""
        started = time.monotonic()
        status, headers, body = self.gateway.complete(max_tokens=2)
        assert status == 200, body
        took = time.monotonic() - started
        return headers["x-slorouter-route"], headers.get("x-slorouter-fallback-reason"), took

    def breaker(self) -> str:
        states = [k for k, v in self.gateway.metric("slorouter_prediction_breaker_state").items() if v == 1]
        assert len(states) == 1, states
        return states[0].split('"')[1]

    def opened(self) -> float:
        return self.gateway.total("slorouter_prediction_breaker_transitions_total", state="open")

    def bulk_requests(self) -> float:
        return self.gateway.total("slorouter_prediction_client_bulk_requests_total")

    def sink(self, outcome: str) -> float:
        return self.gateway.total("slorouter_training_sink_samples_total", outcome=outcome)

    def buffered(self) -> float:
        return self.gateway.total("slorouter_training_sink_buffered_samples")

    def until_predicted(self, timeout: float = 60.0) -> None:
        """Requests until one is routed by prediction with the breaker closed (each must succeed)."""
        wait_until(lambda: self.request()[0] in PREDICTED and self.breaker() == "closed", timeout, "routed")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("predictor-faults")
    sims = start_sims(2)
    training_args = ["--state-dir", str(tmp / "training"), "--min-samples", "30", "--retrain-interval-s",
                     "0.2", "--train-threads", "1", "--log-level", "WARNING"]  # fmt: skip
    training = PredictorProcess("training-server", training_args, tmp / "training.log")
    prediction_args = ["--training-server", training.url, "--poll-interval-s", "0.1",
                       "--enable-fault-injection", "--log-level", "WARNING"]  # fmt: skip
    prediction = PredictorProcess("prediction-server", prediction_args, tmp / "prediction.log")
    predictor = {
        "mode": "remote",
        "prediction_by_default": True,
        "remote": {
            "training_server": training.url,
            "prediction_servers": [prediction.url],
            "timeout_ms": TIMEOUT_MS,
            "flush_interval_s": 0.1,
            "max_buffered_samples": MAX_BUFFERED,
            "breaker": {
                "failures": 5,
                "latency_budget_ms": BUDGET_MS,
                "window": 40,
                "cooldown_s": COOLDOWN_S,
                "max_cooldown_s": MAX_COOLDOWN_S,
            },
        },
    }
    gateway = GatewayProcess(tmp, [s.address for s in sims], predictor=predictor)
    try:
        training.start()
        prediction.start()
        gateway.start()
        result = Stack(training, prediction, gateway)
        # Warming up: the fallback routes (and says so) until the first model is trained and loaded.
        assert result.request()[:2] == ("fallback", "warming-up")
        result.until_predicted()
        yield result
    finally:
        gateway.stop()
        prediction.stop()
        training.stop()
        for sim in sims:
            sim.stop()


@pytest.fixture
def clean(stack: Stack) -> Iterator[tuple[int, int]]:
    """Both predictor servers up, no fault, routing by prediction; yields the gateway's and the prediction
    server's descriptor counts then."""
    if stack.training.process is None:
        stack.training.start()
    if stack.prediction.process is None:
        stack.prediction.start()
    stack.prediction.clear()
    stack.until_predicted()
    for _ in range(3):
        stack.request()
    yield stack.gateway.fds(), stack.prediction.fds()
    if stack.prediction.process is not None:
        stack.prediction.clear()


# A server that answered an error or garbage is skipped until its next good /readyz: meanwhile no server is
# ready, so requests go by the fallback without a call ("unavailable", or "no-ready-server" if the client
# was asked before it knew).
DOWN = {"no-ready-server", "unavailable"}
FAULTS = {
    "hang": ({"fault": "hang"}, {"timeout"}),
    # Answered, each above the budget but within the timeout (on a loaded machine one may time out).
    "slow": ({"fault": "delay", "delay_ms": (BUDGET_MS + TIMEOUT_MS) // 2}, {"timeout"}),
    "5xx": ({"fault": "status", "status": 500}, {"server-error", *DOWN}),
    "malformed": ({"fault": "malformed"}, {"malformed", *DOWN}),
    "nan": ({"fault": "nan"}, {"malformed", *DOWN}),
    "inf": ({"fault": "inf"}, {"malformed", *DOWN}),
}


def until_open(stack: Stack, before: float) -> list[tuple[str, str | None, float]]:
    """Requests until the breaker has opened (each must succeed); their routes, reasons, durations."""
    seen: list[tuple[str, str | None, float]] = []

    def opened() -> bool:
        seen.append(stack.request())
        return stack.opened() > before

    wait_until(opened, 60, "the breaker opens")
    return seen


def while_open(stack: Stack, n: int = 20) -> tuple[list[tuple[str, str | None, float]], float, float, float]:
    """``n`` requests with the breaker open: their results, the time taken, and how many bulk requests the
    client sent and how many the server was hit by meanwhile."""
    alive = stack.prediction.process is not None
    bulk, hits, started = stack.bulk_requests(), stack.prediction.hits() if alive else 0, time.monotonic()
    results = [stack.request() for _ in range(n)]
    elapsed = time.monotonic() - started
    hit = (stack.prediction.hits() if alive else 0) - hits
    return results, elapsed, stack.bulk_requests() - bulk, hit


def probes_allowed(elapsed: float) -> float:
    """At most one probe per cool-down (the shortest one), and one more for the phase's edges."""
    return elapsed / COOLDOWN_S + 1


@pytest.mark.parametrize("name", list(FAULTS))
def test_prediction_server_fault_routes_by_the_fallback_and_opens_the_breaker(stack, clean, name):
    """Each fault: requests keep getting 200, by the fallback, saying why; the breaker opens and stops the
    calls; the fault cleared, it closes and prediction routes again; nothing leaks."""
    gateway_fds, prediction_fds = clean
    fault, reasons = FAULTS[name]
    opened = stack.opened()
    stack.prediction.inject(**fault)
    before = until_open(stack, opened)
    for route, reason, took in before:
        # Before it opens, a request waits at most the timeout for its prediction (a hang would be forever).
        assert took < 5.0, (route, reason, took)
        if reason is None:
            assert route in PREDICTED, route
        else:
            assert route == "fallback" and reason in reasons | {"breaker-open"}, (route, reason)
    assert stack.breaker() in ("open", "half-open")
    results, elapsed, bulk, hits = while_open(stack)
    slow = name == "slow"  # its probes are answered, slowly: those requests are routed by prediction
    for route, reason, took in results:
        assert took < 5.0
        if route in PREDICTED and slow:
            continue
        allowed = reasons | {"breaker-open", *DOWN}
        assert route == "fallback" and reason in allowed, (route, reason)
    assert sum(reason == "breaker-open" for _, reason, _ in results) >= len(results) / 2, results
    # The calls stopped: only probes reach the server, one per cool-down at most.
    assert bulk <= probes_allowed(elapsed), (bulk, elapsed)
    assert hits <= probes_allowed(elapsed), (hits, elapsed)
    assert stack.gateway.total("slorouter_prediction_client_calls_total", outcome="breaker_open") > 0
    stack.prediction.clear()
    stack.until_predicted(timeout=30)
    stack.gateway.assert_no_leaks(gateway_fds)
    wait_until(lambda: stack.prediction.fds() <= prediction_fds + 2, 10, "prediction-server fds back")


def test_a_slow_tail_opens_the_breaker_and_probes_close_it_between_the_slow_calls(stack, clean):
    """One prediction in five times out (a p80 tail): no five fail in a row, yet the breaker opens (the p99
    of the window is over the budget); the probes that are answered close it again, so prediction and the
    fallback alternate while it lasts, every request answered."""
    gateway_fds, _ = clean
    opened = stack.opened()
    stack.prediction.inject(fault="delay", delay_ms=5 * TIMEOUT_MS, probability=0.2)
    before = until_open(stack, opened)
    assert {route for route, _, _ in before} >= {"fallback", "predicted"}
    assert {reason for _, reason, _ in before} <= {None, "timeout", "breaker-open"}
    closed = stack.gateway.total("slorouter_prediction_breaker_transitions_total", state="closed")
    results = [stack.request() for _ in range(40)]
    assert {reason for _, reason, _ in results} <= {None, "timeout", "breaker-open"}
    assert "breaker-open" in {reason for _, reason, _ in results}
    assert stack.gateway.total("slorouter_prediction_breaker_transitions_total", state="closed") > closed
    assert all(took < 5.0 for _, _, took in results)
    stack.prediction.clear()
    stack.until_predicted(timeout=30)
    stack.gateway.assert_no_leaks(gateway_fds)


def test_prediction_server_killed_routes_by_the_fallback_then_recovers(stack, clean):
    """SIGKILL of the prediction server: 200 by the fallback. The first call's refused connection marks the
    server down and the /readyz loop keeps it so: no server is ready, so no call is made at all (the
    breaker has nothing to stop). On the same port again, prediction routes again."""
    gateway_fds, _ = clean
    stack.prediction.kill()
    first = [stack.request() for _ in range(5)]
    for route, reason, took in first:
        assert took < 5.0
        assert route in PREDICTED or (route == "fallback" and reason in {"unreachable", "timeout", *DOWN})
    results, _, bulk, _ = while_open(stack)
    assert {route for route, _, _ in results} == {"fallback"}
    assert {reason for _, reason, _ in results} <= DOWN, results
    assert bulk == 0  # no request to the dead server
    stack.prediction.start()
    stack.until_predicted(timeout=30)
    stack.gateway.assert_no_leaks(gateway_fds)


def test_training_server_down_buffers_samples_then_delivers_them(stack, clean):
    """The training server stopped for a while: prediction goes on (the prediction server keeps its model),
    samples wait in the bounded queue (max_buffered_samples), the overflow is counted as dropped, and what
    was queued reaches the training server when it is back."""
    wait_until(lambda: stack.buffered() == 0, 10, "the queue drained")
    delivered, sent, dropped = stack.training.samples_added(), stack.sink("sent"), stack.sink("dropped")
    failed = stack.gateway.total("slorouter_training_sink_failed_flushes_total")
    stack.training.stop()  # SIGTERM: it saves its window, so its count survives the restart
    routes = [stack.request()[0] for _ in range(3 * MAX_BUFFERED)]
    assert set(routes) & set(PREDICTED), routes  # still predicted: the models stay loaded
    wait_until(lambda: stack.buffered() == MAX_BUFFERED, 10, "the queue full")
    for _ in range(10):
        stack.request()
    assert stack.buffered() == MAX_BUFFERED  # bounded
    overflow = stack.sink("dropped") - dropped
    assert overflow > 0  # counted, not silently lost
    assert stack.gateway.total("slorouter_training_sink_failed_flushes_total") > failed
    assert stack.sink("sent") == sent  # nothing was sent meanwhile
    stack.training.start()
    wait_until(lambda: stack.buffered() == 0, 20, "the queue delivered")  # in-flight posts included
    assert stack.sink("sent") - sent == MAX_BUFFERED
    assert stack.training.samples_added() - delivered == MAX_BUFFERED
    assert stack.sink("dropped") - dropped == overflow
