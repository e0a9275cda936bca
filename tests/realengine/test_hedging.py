"""A llama-server that stops mid-stream (SIGSTOP: what a garbage-collection pause or a hung GPU looks like
from outside) behind ``slorouter serve`` with a hedging objective: the request that waits on it for its
first token is hedged to another server as soon as the stall shows, long before its hedge delay."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.realengine.conftest import LlamaServer, Reply, completion, post, real_gateway, requires_engine
from tests.reliability.conftest import wait_until

pytestmark = [requires_engine, pytest.mark.timeout(240), pytest.mark.processes]

# Round robin makes the pick of each request known: a stream, then a plain request on the other server, then
# the hedgeable request back on the stream's server.
ROUND_ROBIN = {
    "plugins": [{"type": "round-robin-picker"}],
    "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "round-robin-picker"}]}],
}
SLO_MS = 10_000  # no prediction: the hedge delay is max_slo_share (0.6, set below) of it, 6 s


def test_a_request_on_a_stopped_llama_server_is_hedged_to_another_at_once(
    engines_up: list[LlamaServer], tmp_path
):
    servers = engines_up[:2]
    gateway = real_gateway(
        tmp_path,
        servers,
        scheduler=ROUND_ROBIN,
        objectives={"interactive": {"priority": 1, "deadline": {"action": "hedge"}}},
        hedging={"stall_ms": 300, "max_share": 1.0, "max_slo_share": 0.6},
    ).start()
    stopped: LlamaServer | None = None
    decoding = threading.Event()
    streamed: list[Reply] = []

    def tokens_came(reply: Reply) -> None:
        if len(reply.events) >= 3:
            decoding.set()

    def long_stream() -> None:
        body = completion("Tell me a long story about a lighthouse keeper", max_tokens=300, stream=True)
        streamed.append(post(gateway.address, "/v1/completions", body, on_event=tokens_came))

    stream = threading.Thread(target=long_stream)
    try:
        wait_until(lambda: all(gateway.healthy(s.address) for s in servers), 15, "both endpoints healthy")
        stream.start()
        assert decoding.wait(60), "the stream produced no tokens"
        plain = post(gateway.address, "/v1/completions", completion())
        assert plain.ok
        stopped = next(s for s in servers if s.address != plain.endpoint)
        assert stopped.process is not None
        os.kill(stopped.process.pid, signal.SIGSTOP)
        started = time.monotonic()
        headers = {"x-gateway-inference-objective": "interactive", "x-slo-ttft-ms": str(SLO_MS)}
        reply = post(gateway.address, "/v1/completions", completion(), headers=headers)
        waited = time.monotonic() - started
        assert reply.ok and reply.endpoint == plain.endpoint  # the copy's answer, from the running server
        assert waited < SLO_MS * 0.6 / 1000  # before the hedge delay
        assert gateway.total("slorouter_stall_hedges_total", objective="interactive") == 1
        assert gateway.total("slorouter_hedges_total", objective="interactive", outcome="won") == 1
    finally:
        if stopped is not None and stopped.process is not None:
            os.kill(stopped.process.pid, signal.SIGCONT)
        stream.join(timeout=90)
        gateway.stop()
    assert streamed and streamed[0].ok  # the stopped server's stream went on once it was resumed
