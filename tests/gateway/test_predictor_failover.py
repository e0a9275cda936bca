"""Remote (sidecar) predictor end to end: a training server, two prediction-server processes, simulated pods
and the gateway, all over loopback.

The prediction servers run as real ``slorouter predictor prediction-server`` processes so that "killed" means
SIGKILL (no graceful shutdown, connections reset by the kernel). The training server runs in-process with a
small, fast trainer so a first model is published within a few seconds of traffic. Waits are bounded polls,
not speed claims.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from slorouter.gateway.runtime import Router
from slorouter.predictor.store import StoreConfig
from slorouter.predictor.trainer import TrainerConfig
from slorouter.predictor.training_server import TrainingServer
from slorouter.serving.status import STATUS_PATH, decode_status
from slorouter.sim.server import SimCluster
from tests.gateway.conftest import eventually, start_router
from tests.helpers.processes import free_port

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
FAST_TRAINING = TrainerConfig(n_estimators=30, max_depth=4, min_samples=30, retrain_interval_s=0.2, nthread=1)
PREDICTED_ROUTES = ("predicted", "explore")
CONCURRENCY = 6


class PredictionServerProcess:
    """One ``slorouter predictor prediction-server`` process on a fixed port, pulling models from the
    training server; can be SIGKILLed and started again on the same port."""

    def __init__(self, port: int, training_url: str, log_path: Path) -> None:
        self.port = port
        self.training_url = training_url
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.model_dir: Path | None = None  # set: models from this directory, not the training server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> None:
        assert self.proc is None, "already running"
        source = (
            ["--training-server", self.training_url]
            if self.model_dir is None
            else ["--model-dir", str(self.model_dir)]
        )
        args = [sys.executable, "-m", "slorouter.cli", "predictor", "prediction-server",
                "--host", "127.0.0.1", "--port", str(self.port), *source,
                "--poll-interval-s", "0.1", "--log-level", "WARNING"]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    async def wait_listening(self, http: aiohttp.ClientSession, timeout: float = 30.0) -> None:
        async def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"prediction server on port {self.port} exited with {self.proc.returncode}:\n"
                    + self.log_path.read_text(errors="replace")[-2000:]
                )
            try:
                async with http.get(f"{self.url}/healthz", timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    return resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

        await eventually(healthy, timeout=timeout)

    async def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.proc.wait, 10)
        self.proc = None


class Sidecars:
    """The training server (in-process) and the prediction-server processes."""

    def __init__(self, training: TrainingServer, prediction: list[PredictionServerProcess]) -> None:
        self.training = training
        self.prediction = prediction

    async def start_prediction(self, http: aiohttp.ClientSession) -> None:
        for server in self.prediction:
            server.spawn()
        await asyncio.gather(*(server.wait_listening(http) for server in self.prediction))

    async def kill_prediction(self) -> None:
        await asyncio.gather(*(server.kill() for server in self.prediction))

    async def samples_received(self, http: aiohttp.ClientSession) -> int:
        """Training samples the training server has accepted so far, read from its ``/v1/status``."""
        async with http.get(f"{self.training.url}/v1/status") as resp:
            assert resp.status == 200
            status = await resp.json()
        return sum(int(model["samples_added_total"]) for model in status["models"].values())

    def predictor_config(self) -> dict[str, Any]:
        return {
            "mode": "remote",
            "prediction_by_default": True,
            "remote": {
                "training_server": self.training.url,
                "prediction_servers": [server.url for server in self.prediction],
                # Generous: this test is about failover, and a loaded CI core must not turn into fallbacks.
                "timeout_ms": 2000,
                "flush_interval_s": 0.1,
            },
        }


@pytest.fixture
async def sidecars(tmp_path: Path, http: aiohttp.ClientSession) -> AsyncIterator[Sidecars]:
    training = TrainingServer(
        tmp_path / "models",
        store_config=StoreConfig(),
        trainer_config=FAST_TRAINING,
        train_poll_interval_s=0.05,
    )
    await training.start("127.0.0.1", 0)
    prediction = [
        PredictionServerProcess(free_port(), training.url, tmp_path / f"prediction-{i}.log") for i in range(2)
    ]
    result = Sidecars(training, prediction)
    try:
        await result.start_prediction(http)
        yield result
    finally:
        await result.kill_prediction()
        await training.stop()


async def _send(
    http: aiohttp.ClientSession,
    router: Router,
    model: str,
    n: int,
    *,
    headers: dict[str, str] | None = None,
    first: int = 0,
) -> list[CIMultiDictProxy[str]]:
    """``n`` varied completions, ``CONCURRENCY`` at a time; every one must succeed. Their response headers."""

    async def one(i: int) -> CIMultiDictProxy[str]:
        body = {
            "model": model,
            "prompt": f"request {i} " + "words " * (5 + 40 * (i % 7)),
            "max_tokens": 2 + i % 5,
        }
        async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as resp:
            text = await resp.text()
            assert resp.status == 200, text
            return resp.headers

    results: list[CIMultiDictProxy[str]] = []
    for start in range(first, first + n, CONCURRENCY):
        results += await asyncio.gather(*(one(i) for i in range(start, min(start + CONCURRENCY, first + n))))
    return results


def _routes(headers: list[CIMultiDictProxy[str]]) -> list[str]:
    return [h["x-slorouter-route"] for h in headers]


async def _until_predicted(
    http: aiohttp.ClientSession, router: Router, model: str, *, first: int = 0, timeout: float = 60.0
) -> None:
    """Traffic until a request is routed by prediction (every request must succeed meanwhile)."""
    sent = first

    async def predicted() -> bool:
        nonlocal sent
        routes = _routes(await _send(http, router, model, CONCURRENCY, first=sent))
        sent += CONCURRENCY
        return any(route in PREDICTED_ROUTES for route in routes)

    await eventually(predicted, timeout=timeout)


class Traffic:
    """Requests sent continuously in the background, ``CONCURRENCY`` at a time; each batch's start time and
    routes are recorded. A failed request (not 200) fails the task, which ``stop`` re-raises."""

    def __init__(self, http: aiohttp.ClientSession, router: Router, model: str) -> None:
        self.http, self.router, self.model = http, router, model
        self.batches: list[tuple[float, list[str]]] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        first = 10_000
        while not self._stop.is_set():
            started = loop.time()
            headers = await _send(self.http, self.router, self.model, CONCURRENCY, first=first)
            self.batches.append((started, _routes(headers)))
            first += CONCURRENCY

    def routes_since(self, t: float) -> list[str]:
        return [route for started, routes in self.batches if started >= t for route in routes]

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task  # re-raises a failed request's assertion


def _fallbacks(router: Router, reason: str) -> float:
    for line in router.metrics.render().decode().splitlines():
        if line.startswith(f'slorouter_prediction_fallbacks_total{{reason="{reason}"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _grew(sidecars: Sidecars, http: aiohttp.ClientSession, before: int) -> bool:
    return await sidecars.samples_received(http) > before


async def test_prediction_servers_killed_and_restarted(
    cluster: SimCluster, http: aiohttp.ClientSession, sidecars: Sidecars
) -> None:
    router = await start_router(list(cluster.addresses), predictor=sidecars.predictor_config())
    loop = asyncio.get_running_loop()
    traffic = Traffic(http, router, cluster.model)
    try:
        samples = [await sidecars.samples_received(http)]
        # Warming up: no model yet, so the heuristic fallback routes; the samples train the first model.
        warm = _routes(await _send(http, router, cluster.model, CONCURRENCY))
        assert warm == ["fallback"] * CONCURRENCY
        await _until_predicted(http, router, cluster.model, first=CONCURRENCY)
        async with http.get(f"{sidecars.training.url}/v1/status") as resp:
            assert (await resp.json())["models"]["ttft"]["version"]  # trained by the training server
        await eventually(lambda: all(s.ready for s in router.predictor.client.servers), timeout=10)

        # (a) Trained: requests are routed by prediction, with the predicted TTFT in the headers.
        headers = await _send(http, router, cluster.model, 12, first=1000)
        assert set(_routes(headers)) <= set(PREDICTED_ROUTES), _routes(headers)
        assert "predicted" in _routes(headers)
        assert all(float(h["x-slorouter-predicted-ttft-ms"]) > 0 for h in headers)
        await eventually(lambda: _grew(sidecars, http, samples[-1]), timeout=10)
        samples.append(await sidecars.samples_received(http))

        # (b) Every prediction server killed (SIGKILL) while traffic flows: requests keep succeeding (Traffic
        # checks each one), and those scheduled after the kill are routed by the fallback.
        traffic.start()
        await eventually(lambda: len(traffic.batches) >= 2, timeout=10)
        fallbacks_before = _fallbacks(router, "unavailable") + _fallbacks(router, "warming-up")
        await sidecars.kill_prediction()
        killed_at = loop.time()
        await eventually(lambda: len(traffic.routes_since(killed_at)) >= 3 * CONCURRENCY, timeout=20)
        down = traffic.routes_since(killed_at)
        assert set(down) == {"fallback"}, down
        # Each is counted as a fallback: "unavailable" while the client still believes a server is up, then
        # "warming-up", because the producer labels every not-ready backend so (dead servers included).
        fallbacks = _fallbacks(router, "unavailable") + _fallbacks(router, "warming-up")
        assert fallbacks - fallbacks_before >= len(down)
        # (d) ... and their training samples still reach the training server.
        await eventually(lambda: _grew(sidecars, http, samples[-1]), timeout=10)
        samples.append(await sidecars.samples_received(http))

        # (c) Prediction servers back on the same ports (new processes, which fetch the model from the
        # training server): routing returns to prediction within a bounded wait, traffic still flowing.
        await sidecars.start_prediction(http)
        restarted_at = loop.time()
        await eventually(
            lambda: any(route in PREDICTED_ROUTES for route in traffic.routes_since(restarted_at)), timeout=30
        )
        await traffic.stop()
        back = await _send(http, router, cluster.model, 12, first=3000)
        assert set(_routes(back)) <= set(PREDICTED_ROUTES), _routes(back)
        await eventually(lambda: _grew(sidecars, http, samples[-1]), timeout=10)
        samples.append(await sidecars.samples_received(http))
        assert samples == sorted(set(samples)), samples  # strictly increasing across all phases
        assert router.predictor.sink.stats.dropped == 0
    finally:
        try:
            await traffic.stop()
        finally:
            await router.stop()


async def test_opting_out_routes_by_the_heuristic_profile(
    cluster: SimCluster, http: aiohttp.ClientSession, sidecars: Sidecars
) -> None:
    router = await start_router(list(cluster.addresses), predictor=sidecars.predictor_config())
    try:
        await _until_predicted(http, router, cluster.model)
        # With predictions available, the header still opts the request out of the predicted-latency profile.
        opted_out = await _send(
            http, router, cluster.model, 8, headers={"x-prediction-based-scheduling": "false"}, first=500
        )
        assert _routes(opted_out) == ["heuristic"] * 8
        assert not any("x-slorouter-predicted-ttft-ms" in h for h in opted_out)
        default = await _send(http, router, cluster.model, 6, first=600)
        assert set(_routes(default)) <= set(PREDICTED_ROUTES)
    finally:
        await router.stop()


async def test_a_prediction_server_left_on_an_old_model_is_reported_and_passed_over(
    cluster: SimCluster, http: aiohttp.ClientSession, sidecars: Sidecars, tmp_path: Path
) -> None:
    config = sidecars.predictor_config()
    config["remote"]["stale_after_s"] = 1.0
    router = await start_router(list(cluster.addresses), predictor=config)
    try:
        await _until_predicted(http, router, cluster.model)
        client = router.predictor.client
        await eventually(lambda: all(s.ready and s.versions for s in client.servers), timeout=10)
        # The second server restarts on a copy of the models as they are now, and never sees another.
        frozen = tmp_path / "frozen-models"
        shutil.copytree(sidecars.training.model_dir, frozen)
        stuck = sidecars.prediction[1]
        await stuck.kill()
        stuck.model_dir = frozen
        stuck.spawn()
        await stuck.wait_listening(http)
        sent = 2000

        async def reported() -> bool:
            nonlocal sent
            await _send(http, router, cluster.model, CONCURRENCY, first=sent)  # new models get trained
            sent += CONCURRENCY
            return stuck.url in router.predictor.stale_servers

        await eventually(reported, timeout=60)
        assert not client.servers[0].stale
        metrics = router.metrics.render().decode()
        assert f'slorouter_prediction_server_stale{{server="{stuck.url}"}} 1.0' in metrics
        async with http.get(f"http://{router.address}{STATUS_PATH}") as resp:
            status = decode_status(await resp.read())
        assert set(status.predictor.stale_servers) == {stuck.url}
        assert status.predictor.versions == router.predictor.sink.published_versions
        # Predictions go to the current server while it is ready.
        stale_requests = client.servers[1].requests
        routes = _routes(await _send(http, router, cluster.model, 12, first=5000))
        assert set(routes) <= set(PREDICTED_ROUTES), routes
        assert client.servers[1].requests == stale_requests
    finally:
        await router.stop()
