"""The real engine: llama.cpp's ``llama-server`` processes on 127.0.0.1, serving Gemma 3 270M (GGUF Q4_K_M),
and what the tests read of them (health, the ``llamacpp:*`` metrics, ``/tokenize``).

The binary and the model come from the environment (``make test-realengine`` builds and sets both):
``SLOROUTER_LLAMA_SERVER`` (the llama-server binary) and ``SLOROUTER_LLAMA_MODEL`` (the GGUF file). Without
them every test here is skipped, saying so; set but pointing at nothing, the tests fail.

Each server runs 4 slots (``--parallel 4``) on one thread, with a small context, so the whole suite stays
within a few minutes on two cores. Every wait is a bounded poll; no test asserts a speed.
"""

from __future__ import annotations

import http.client as httpclient
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.processes import free_port
from tests.reliability.conftest import (
    GatewayProcess,
    RestartableProcess,
    http,
    samples,
    terminate,
    wait_until,
)

BINARY = os.environ.get("SLOROUTER_LLAMA_SERVER", "")
MODEL_FILE = os.environ.get("SLOROUTER_LLAMA_MODEL", "")
# The name the servers answer to (--alias) and the requests carry.
MODEL = "gemma3-270m"
SLOTS = 4
# The context of one server, shared by its slots (llama-server divides it among them).
CTX_SIZE = 2048
# A server loads the 253 MB model (memory-mapped) and warms up before /health answers 200.
START_TIMEOUT_S = 90.0

requires_engine = pytest.mark.skipif(
    not (BINARY and MODEL_FILE),
    reason="no real engine: set SLOROUTER_LLAMA_SERVER and SLOROUTER_LLAMA_MODEL (make test-realengine does)",
)


def check_paths() -> None:
    """Set but wrong is an error, not a skip."""
    assert os.access(BINARY, os.X_OK), f"SLOROUTER_LLAMA_SERVER={BINARY!r} is not an executable file"
    assert Path(MODEL_FILE).is_file(), f"SLOROUTER_LLAMA_MODEL={MODEL_FILE!r} is not a file"


class LlamaServer(RestartableProcess):
    """One ``llama-server`` on a fixed port (so it comes back at the same address after a kill)."""

    def __init__(self, log_dir: Path, index: int, *, metrics: bool = True) -> None:
        self.metrics = metrics  # --metrics: without it, /metrics answers 501
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = log_dir / f"llama-server-{index}.log"
        self.starts = 0

    def start(self) -> LlamaServer:
        self.starts += 1
        argv = [
            BINARY, "--model", MODEL_FILE, "--alias", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
            "--parallel", str(SLOTS), "--threads", "1", "--threads-batch", "1", "--ctx-size", str(CTX_SIZE),
            "--no-webui", *(["--metrics"] if self.metrics else []),
        ]  # fmt: skip
        with self.log.open("a") as log:
            log.write(f"--- start {self.starts}: {' '.join(argv)}\n")
            log.flush()
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        wait_until(self._up, START_TIMEOUT_S, f"llama-server on {self.address} healthy")
        return self

    def _up(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.tail()
        try:
            return http("GET", f"{self.url}/health", timeout=2)[0] == 200
        except OSError:
            return False

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def metric(self, name: str) -> float:
        """A ``llamacpp:*`` gauge or counter (the server has one sample of each)."""
        status, _, body = http("GET", f"{self.url}/metrics")
        assert status == 200, body
        return sum(samples(body.decode(), name).values())

    def processing(self) -> float:
        """Requests the server's slots hold now."""
        return self.metric("llamacpp:requests_processing")

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        status, _, body = http("POST", f"{self.url}/tokenize", {"content": text, "add_special": add_special})
        assert status == 200, body
        tokens: list[int] = json.loads(body)["tokens"]
        return tokens

    def post(self, path: str, body: Any, timeout: float = 60.0) -> tuple[int, dict[str, str], bytes]:
        return http("POST", f"{self.url}{path}", body, timeout=timeout)


def idle(servers: list[LlamaServer]) -> bool:
    """No slot busy on any running server."""
    return all(server.processing() == 0 for server in servers if server.alive)


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LlamaServer]]:
    """Three llama-servers for the whole session (a test that kills one starts it again)."""
    check_paths()
    log_dir = tmp_path_factory.mktemp("llama-server")
    servers = [LlamaServer(log_dir, i) for i in range(3)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            terminate(server.process, timeout=10)


@pytest.fixture
def engines_up(engines: list[LlamaServer]) -> list[LlamaServer]:
    """Every server running and idle (a previous test may have killed one, or left a slot busy)."""
    for server in engines:
        if not server.alive:
            server.start()
    wait_until(lambda: idle(engines), 30, "every llama-server idle")
    return engines


@dataclass
class Reply:
    """One response: status, headers (lower-case names), and either the whole body or, for an event
    stream, its ``data:`` payloads in order."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    events: list[bytes] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def endpoint(self) -> str | None:
        return self.headers.get("x-slorouter-endpoint")

    @property
    def chunks(self) -> list[dict[str, Any]]:
        """The stream's JSON events (``[DONE]`` left out)."""
        return [json.loads(event) for event in self.events if event != b"[DONE]"]

    @property
    def stream_error(self) -> dict[str, Any] | None:
        """The error event that ended the stream, if one did."""
        errors = [chunk["error"] for chunk in self.chunks if "error" in chunk]
        return errors[-1] if errors else None

    @property
    def ok(self) -> bool:
        """200, and a stream ended by ``[DONE]`` without an error event."""
        if self.status != 200:
            return False
        return not self.events or (self.events[-1] == b"[DONE]" and self.stream_error is None)


def post(
    address: str,
    path: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    leave_after: int | None = None,
    on_event: Callable[[Reply], None] | None = None,
    timeout: float = 60.0,
) -> Reply:
    """POST ``body`` as JSON; an event stream is read event by event (``on_event`` runs after each), and
    with ``leave_after`` the client closes the connection after that many events (it leaves mid-stream)."""
    conn = httpclient.HTTPConnection(address, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        reply = Reply(response.status, {k.lower(): v for k, v in response.getheaders()})
        if "text/event-stream" not in reply.headers.get("content-type", ""):
            reply.body = response.read()
            return reply
        while line := response.readline():
            if line.startswith(b"data: "):
                reply.events.append(line[6:].strip())
                if on_event is not None:
                    on_event(reply)
                if leave_after is not None and len(reply.events) >= leave_after:
                    break
        return reply
    finally:
        conn.close()


def completion(prompt: str = "The capital of France is", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, **extra}


def chat(content: str = "Name a colour.", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }


def real_gateway(tmp: Path, servers: list[LlamaServer], **overrides: Any) -> GatewayProcess:
    """``slorouter serve`` (not started) with the servers as its static ``pool.endpoints``, and upstream
    timeouts loose enough for a CPU engine on a busy machine (the reliability tests' are tight)."""
    gateway = {
        "upstream_first_byte_timeout_s": 60.0,
        "upstream_idle_timeout_s": 30.0,
        "max_upstream_body_bytes": 8 << 20,
        **overrides.pop("gateway", {}),
    }
    return GatewayProcess(tmp, [server.address for server in servers], gateway=gateway, **overrides)


def router_inflight(gateway: GatewayProcess) -> float:
    """Requests the router counts in flight, over every endpoint."""
    return sum(gateway.metric("slorouter_inflight_requests").values())
