"""Real processes on 127.0.0.1 for the fault tests: ``slorouter sim`` pods (one process each, so one can be
killed) and ``slorouter serve``, with what the tests read of them: faults, engine load, the router's
in-flight gauges, endpoint health and open file descriptors.

Every wait is a bounded poll (``wait_until``); no test asserts a speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.processes import free_port, wait_for_line

MODEL = "sim-llama3-8b"
CLI = [sys.executable, "-c", "import sys; from slorouter.cli import main; sys.exit(main())"]
_INFLIGHT = (
    "slorouter_inflight_requests",
    "slorouter_inflight_prefill_tokens",
    "slorouter_inflight_decode_tokens",
)
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$")


def wait_until(check: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` seconds (a bound, not a speed claim)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met within {timeout:g} s")
        time.sleep(0.02)


def http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One plain request: status, headers (lower-case names), body; HTTP errors are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def samples(page: str, name: str) -> dict[str, float]:
    """The samples of metric ``name`` on a Prometheus page, by their label text."""
    found = {}
    for line in page.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            found[match.group(2) or ""] = float(match.group(3))
    return found


def terminate(process: subprocess.Popen[str] | None, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    if process is None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class RestartableProcess:
    """A child process on a fixed port that a test kills or stops and starts again."""

    process: subprocess.Popen[str] | None = None

    def kill(self) -> None:
        """SIGKILL: the process dies at once, its connections reset by the kernel."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def stop(self) -> None:
        terminate(self.process)
        self.process = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class SimProcess(RestartableProcess):
    """``slorouter sim`` with one pod on a fixed port, which can be killed and started again."""

    def __init__(self, profile: str = "llama3-8b-h100", port: int | None = None) -> None:
        self.profile = profile
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"

    def start(self, *faults: str) -> SimProcess:
        return self.launch(*faults).ready()

    def launch(self, *faults: str) -> SimProcess:
        """Starts the process without waiting for it (``ready`` waits)."""
        args = [*CLI, "sim", "--port", str(self.port), "--profile", self.profile, "--model", MODEL]
        for fault in faults:
            args += ["--fault", fault]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self

    def ready(self) -> SimProcess:
        """Waits until the pod listens."""
        assert self.process is not None
        wait_for_line(self.process, f"http://{self.address}")
        return self

    def inject(self, **fault: Any) -> dict[str, Any]:
        status, _, body = http("POST", f"http://{self.address}/admin/faults", fault)
        assert status == 200, body
        return dict(json.loads(body))

    def clear(self) -> None:
        if self.alive:
            status, _, body = http("DELETE", f"http://{self.address}/admin/faults")
            assert status == 200, body

    def hits(self, name: str) -> int:
        _, _, body = http("GET", f"http://{self.address}/admin/faults")
        return sum(f["hits"] for f in json.loads(body)["faults"] if f["fault"] == name)

    def engine_load(self) -> float:
        """Sequences the engine holds (running + waiting), from its /metrics."""
        _, _, body = http("GET", f"http://{self.address}/metrics")
        page = body.decode()
        running = samples(page, "vllm:num_requests_running")
        waiting = samples(page, "vllm:num_requests_waiting")
        return sum(running.values()) + sum(waiting.values())

    def successes(self) -> float:
        _, _, body = http("GET", f"http://{self.address}/metrics")
        return sum(samples(body.decode(), "vllm:request_success_total").values())


def start_sims(count: int) -> list[SimProcess]:
    """``count`` pods, started side by side and then each waited for (all killed if one fails)."""
    pods = [SimProcess().launch() for _ in range(count)]
    try:
        return [pod.ready() for pod in pods]
    except BaseException:
        for pod in pods:
            pod.kill()
        raise


class GatewayProcess:
    """``slorouter serve --config`` on a free port, in front of ``endpoints``."""

    def __init__(self, tmp: Path, endpoints: list[str], **overrides: Any) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        gateway = {
            "host": "127.0.0.1",
            "port": self.port,
            "connect_timeout_s": 1.0,
            "upstream_first_byte_timeout_s": 2.0,
            "upstream_idle_timeout_s": 1.0,
            "max_upstream_body_bytes": 1 << 20,
            **overrides.pop("gateway", {}),
        }
        pool = {
            "endpoints": endpoints,
            "scrape_interval_ms": 50,
            "scrape_timeout_ms": 300,
            "unhealthy_after_failures": 3,
            **overrides.pop("pool", {}),
        }
        self.config = tmp / f"gateway-{self.port}.yaml"
        self.config.write_text(yaml.safe_dump({"gateway": gateway, "pool": pool, "seed": 7, **overrides}))
        self.log = tmp / f"gateway-{self.port}.log"
        self.process: subprocess.Popen[str] | None = None

    def start(self, *args: str) -> GatewayProcess:
        """Starts it (``args``: more ``slorouter serve`` options) and waits until it answers."""
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [*CLI, "serve", "--config", str(self.config), "--log-level", "WARNING", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )

        def up() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()[-2000:]
            try:
                return http("GET", f"http://{self.address}/health", timeout=1)[0] == 200
            except OSError:
                return False

        wait_until(up, 30, "the gateway listens")
        return self

    def stop(self) -> None:
        terminate(self.process)
        self.process = None

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def metrics(self) -> str:
        return http("GET", f"{self.url}/metrics")[2].decode()

    def metric(self, name: str) -> dict[str, float]:
        return samples(self.metrics(), name)

    def total(self, name: str, **labels: str) -> float:
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        return sum(v for k, v in self.metric(name).items() if all(w in k for w in wanted))

    def healthy(self, address: str) -> bool:
        return self.metric("slorouter_endpoint_healthy").get(f'{{endpoint="{address}"}}') == 1.0

    def inflight(self) -> dict[str, float]:
        """The in-flight gauges (requests, prefill and decode tokens) of every endpoint."""
        page = self.metrics()
        return {
            f"{name}{labels}": value for name in _INFLIGHT for labels, value in samples(page, name).items()
        }

    def fds(self) -> int:
        assert self.process is not None
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def complete(self, stream: bool = False, max_tokens: int = 8, timeout: float = 15.0, **extra: Any):
        body = {"model": MODEL, "prompt": "Hello, world", "max_tokens": max_tokens, "stream": stream, **extra}
        return http("POST", f"{self.url}/v1/completions", body, timeout=timeout)

    def assert_no_leaks(self, baseline_fds: int, slack: int = 6) -> None:
        """In-flight gauges back to exactly zero (released once: never negative) and no descriptor growth
        beyond ``slack`` (kept-alive upstream connections and scrapes come and go)."""
        wait_until(lambda: all(v == 0 for v in self.inflight().values()), 10, "in-flight back to 0")
        gauges = self.inflight()
        assert len(gauges) >= 3 and all(v == 0 for v in gauges.values()), gauges
        wait_until(lambda: self.fds() <= baseline_fds + slack, 10, f"fds back to {baseline_fds}+{slack}")


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    pods = start_sims(3)
    try:
        yield pods
    finally:
        for pod in pods:
            pod.stop()


@pytest.fixture(scope="module")
def gateway(sims: list[SimProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("gateway"), [s.address for s in sims]).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def clean(sims: list[SimProcess], gateway: GatewayProcess) -> Iterator[int]:
    """Every pod up, without faults, healthy in the router; yields the router's descriptor count then."""
    for sim in sims:
        if not sim.alive:
            sim.start()
        sim.clear()
    wait_until(lambda: all(gateway.healthy(s.address) for s in sims), 15, "every endpoint healthy")
    for _ in range(3):  # warm the kept-alive connections so the baseline holds them
        assert gateway.complete(max_tokens=2)[0] == 200
    yield gateway.fds()
    for sim in sims:
        sim.clear()
