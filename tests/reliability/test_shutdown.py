"""SIGTERM under load: the gateway refuses new connections, lets the streams in progress finish (up to
``gateway.shutdown_drain_timeout_s``), cuts what is still running at that bound, and exits 0."""

from __future__ import annotations

import http.client as httpclient
import json
import signal
import socket
import threading
from pathlib import Path

import pytest

from tests.reliability.conftest import MODEL, GatewayProcess, SimProcess, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]


class _Stream(threading.Thread):
    """One streamed completion read in the background: its ``data:`` payloads as they arrive."""

    def __init__(self, address: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.address, self.max_tokens = address, max_tokens
        self.status = 0
        self.events: list[bytes] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = httpclient.HTTPConnection(self.address, timeout=60)
        body = {"model": MODEL, "prompt": "Hello, world", "max_tokens": self.max_tokens, "stream": True}
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            self.status = response.status
            while line := response.readline():
                if line.startswith(b"data: "):
                    self.events.append(line[6:].strip())
        except (OSError, httpclient.HTTPException) as exc:
            self.error = exc
        finally:
            conn.close()


def _refuses_connections(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except (ConnectionRefusedError, ConnectionResetError):  # reset: the listener closed with it queued
        return True


def _tokens(events: list[bytes]) -> int:
    return sum(1 for e in events if e != b"[DONE]" and json.loads(e)["choices"][0].get("text"))


@pytest.fixture
def pod() -> SimProcess:
    sim = SimProcess().start()
    yield sim
    sim.stop()


def test_sigterm_drains_the_streams_in_progress_and_exits_0(pod: SimProcess, tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path, [pod.address], gateway={"shutdown_drain_timeout_s": 30}).start()
    streams = [_Stream(gateway.address, max_tokens=300) for _ in range(3)]
    for s in streams:
        s.start()
    wait_until(lambda: all(s.events for s in streams), 15, "every stream has its first token")
    assert gateway.process is not None
    gateway.process.send_signal(signal.SIGTERM)
    wait_until(lambda: _refuses_connections(gateway.address), 10, "new connections refused")
    assert any(s.is_alive() for s in streams), "the streams were still running when the drain began"
    for s in streams:
        s.join(60)
        assert not s.is_alive() and s.error is None and s.status == 200, s.error
        assert s.events[-1] == b"[DONE]" and _tokens(s.events) == 300
    assert gateway.process.wait(30) == 0
    assert "still running" not in gateway.log.read_text()
    wait_until(lambda: pod.engine_load() == 0, 10, "the pod's engine idle")


def test_a_stream_longer_than_the_drain_bound_is_cut_and_the_gateway_still_exits_0(
    pod: SimProcess, tmp_path: Path
) -> None:
    gateway = GatewayProcess(tmp_path, [pod.address], gateway={"shutdown_drain_timeout_s": 0.5}).start()
    long = _Stream(gateway.address, max_tokens=20_000)
    long.start()
    wait_until(lambda: bool(long.events), 15, "the stream has its first token")
    assert gateway.process is not None
    gateway.process.send_signal(signal.SIGTERM)
    assert gateway.process.wait(30) == 0
    long.join(30)
    assert not long.is_alive()
    assert b"[DONE]" not in long.events  # cut at the bound, not finished
    assert "1 requests still running after 0.5 s are cut" in gateway.log.read_text()
    wait_until(lambda: pod.engine_load() == 0, 15, "the pod frees the aborted sequence")
