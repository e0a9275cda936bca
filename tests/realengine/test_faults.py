"""Faults of real engines behind ``slorouter serve``: a llama-server killed (SIGKILL) under load, then
started again on its port (what the clients see is what docs/reliability.md, "Model-server faults",
promises, and routing recovers); a llama-server started without ``--metrics``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

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
from tests.reliability.conftest import GatewayProcess, wait_until

pytestmark = [requires_engine, pytest.mark.timeout(240), pytest.mark.processes]

CLIENTS = 6  # concurrent clients, two per server: every server has requests in flight


@pytest.fixture
def gateway(engines_up: list[LlamaServer], tmp_path) -> Iterator[GatewayProcess]:
    process = real_gateway(tmp_path, engines_up, pool={"scrape_interval_ms": 100}).start()
    try:
        wait_until(lambda: all(process.healthy(s.address) for s in engines_up), 15, "every endpoint healthy")
        yield process
    finally:
        process.stop()


@dataclass
class Outcome:
    started: float
    ended: float
    stream: bool
    reply: Reply | None  # None: the request raised (no answer at all)


class Load:
    """``CLIENTS`` threads, each sending requests one after another (streamed and not, in turn) until
    stopped; every outcome is kept with its start and end times (monotonic)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,)) for i in range(CLIENTS)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)

    def _client(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            stream = (index + n) % 2 == 0
            n += 1
            body = completion(f"Request {index}-{n}: tell me a story about", max_tokens=24, stream=stream)
            started = time.monotonic()
            try:
                reply: Reply | None = post(self.address, "/v1/completions", body, timeout=60)
            except OSError:
                reply = None
            with self._lock:
                self.outcomes.append(Outcome(started, time.monotonic(), stream, reply))

    def served_by(self, address: str, after: float) -> int:
        with self._lock:
            replies = [o.reply for o in self.outcomes if o.started > after and o.reply is not None]
            return sum(1 for reply in replies if reply.endpoint == address and reply.ok)

    def count(self) -> int:
        with self._lock:
            return len(self.outcomes)


def test_a_server_killed_under_load_and_restarted(gateway: GatewayProcess, engines_up: list[LlamaServer]):
    """Under six clients' load, the llama-server serving a long stream is killed after its third event.

    - That stream ends with the tokens sent so far, an OpenAI error event (502, "failed mid-stream") and
      ``[DONE]``. The only other requests that may fail are streams the server was serving when it died,
      the same way (at most as many as its slots). A non-streamed request it held, and every request sent
      to it after its death before the router marks it unhealthy, is retried once on another server: the
      client gets a 200.
    - The router marks it unhealthy; the two others serve everything meanwhile.
    - Started again on the same port, it is healthy at the next scrapes and gets requests again.
    - Afterwards nothing is left in flight, in the router or in any engine.
    """
    killed: list[tuple[LlamaServer, float]] = []

    def kill_after_the_third_event(reply: Reply) -> None:
        if len(reply.events) == 3:
            server = next(s for s in engines_up if s.address == reply.endpoint)
            killed.append((server, time.monotonic()))
            server.kill()

    with Load(gateway.address) as load:
        wait_until(lambda: load.count() >= CLIENTS, 60, "the load running")
        body = completion("Once upon a time", max_tokens=400, stream=True)
        long = post(gateway.address, "/v1/completions", body, on_event=kill_after_the_third_event)
        (victim, killed_at), *_ = killed
        assert long.status == 200 and len(long.events) == 5, long.events[-2:]  # 3 tokens, the error, [DONE]
        wait_until(lambda: not gateway.healthy(victim.address), 15, "the killed server marked unhealthy")
        served = load.count()
        wait_until(lambda: load.count() >= served + 6, 60, "the two others serving meanwhile")
        victim.start()
        restarted_at = time.monotonic()
        wait_until(lambda: gateway.healthy(victim.address), 15, "the restarted server healthy again")
        wait_until(
            lambda: load.served_by(victim.address, restarted_at) >= 2, 60, "requests served by it again"
        )
    failed = [o for o in load.outcomes if o.reply is None or not o.reply.ok]
    for reply in [long] + [o.reply for o in failed if o.reply is not None]:
        assert reply.status == 200 and reply.endpoint == victim.address, (reply.status, reply.body)
        error = reply.stream_error
        assert error is not None and error["code"] == 502 and "failed mid-stream" in error["message"]
        assert reply.events[-1] == b"[DONE]"
    for outcome in failed:
        assert outcome.reply is not None, "a request got no answer at all"
        assert outcome.stream and outcome.started < killed_at < outcome.ended
    assert len(failed) <= SLOTS - 1  # the long stream held one of its slots
    assert len(load.outcomes) - len(failed) >= 10
    assert gateway.total("slorouter_upstream_failures_total", endpoint=victim.address, phase="stream") >= 1
    wait_until(lambda: inflight(gateway) == 0, 15, "the router's in-flight count back to 0")
    wait_until(lambda: idle(engines_up), 30, "every llama-server slot free")


def test_a_server_without_metrics_is_unhealthy_and_the_log_says_why(tmp_path):
    """llama-server serves /metrics only with ``--metrics`` (else 501 and an OpenAI-style error saying so):
    the router cannot read its load, marks it unhealthy, answers 503 with ``Retry-After``, and its warning
    carries llama-server's own explanation."""
    server = LlamaServer(tmp_path, 9, metrics=False).start()
    gateway = real_gateway(tmp_path, [server]).start()
    try:
        wait_until(lambda: "is unhealthy" in gateway.log.read_text(), 15, "the endpoint marked unhealthy")
        assert "HTTP 501: This server does not support metrics endpoint. Start it with `--metrics`" in (
            gateway.log.read_text()
        )
        reply = post(gateway.address, "/v1/completions", completion())
        assert reply.status == 503 and reply.headers["retry-after"] == "1"
        assert reply.json()["error"]["type"] == "ServiceUnavailableError"
    finally:
        gateway.stop()
        server.stop()
