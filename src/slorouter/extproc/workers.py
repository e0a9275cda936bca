"""``slorouter epp --workers N``: one picker pod on several cores.

A picker process uses one core. With ``--workers N`` the command supervises N worker processes, each a whole
endpoint picker (its own router, scraping the same pods) that binds the shared ext_proc and gRPC health
ports with ``SO_REUSEPORT``, so the kernel spreads the data plane's connections across them. Each worker
advertises a small ``SETTINGS_MAX_CONCURRENT_STREAMS``, so a data plane with many streams in flight opens
several connections instead of one. The supervisor serves the pod's ``/metrics`` (every worker's series
with a ``worker`` label), ``/health`` and ``/ready``; it restarts a worker that dies, and on SIGTERM lets
every worker drain.

Each worker routes the requests of its own connections; the workers share their in-flight counts
(``slorouter.pool.inflight_sharing``, over sockets in a directory the supervisor passes with
``--share-inflight``), and the scraped signals are the same for all (``docs/deploy.md`` on sizing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from slorouter.children import stop_with_parent
from slorouter.http.server import HttpRequest, HttpServer, Response, json_error, json_response

log = logging.getLogger(__name__)

# What a worker prints once it listens, for its supervisor: the port of its own /metrics (127.0.0.1).
READY_LINE = "slorouter-epp-worker metrics-port="
RESTART_DELAY_S = 1.0
START_TIMEOUT_S = 120.0


def merge_expositions(pages: Sequence[tuple[str, str]]) -> bytes:
    """The Prometheus pages of several workers as one: every sample labelled ``worker``, one family each."""
    families: dict[str, Metric] = {}
    for worker, text in pages:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
            merged.samples.extend(
                sample._replace(labels={**sample.labels, "worker": worker}) for sample in family.samples
            )
    registry = CollectorRegistry()
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


@dataclass
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    metrics_port: int | None = None
    restarts: int = 0
    output: asyncio.Task[None] | None = field(default=None, repr=False)


class WorkerPool:
    """N worker processes of ``slorouter epp``, started with ``argv`` + ``--worker-index i``."""

    def __init__(self, argv: Sequence[str], count: int, drain_timeout_s: float) -> None:
        self._argv = list(argv)
        self._drain_timeout_s = drain_timeout_s
        self.workers = [_Worker(i) for i in range(count)]
        self._watch: asyncio.Task[None] | None = None
        self._http: HttpServer | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self, metrics_host: str, metrics_port: int) -> int:
        """Start every worker and wait until each listens; then serve /metrics, /health and /ready."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        await asyncio.gather(*(self._spawn(worker) for worker in self.workers))
        self._watch = asyncio.create_task(self._supervise(), name="epp-workers")
        self._http = HttpServer(max_body_bytes=1024)
        self._http.add_route("GET", "/metrics", self._metrics)
        self._http.add_route("GET", "/health", self._health)
        self._http.add_route("GET", "/ready", self._ready)
        _, port = await self._http.start(metrics_host, metrics_port)
        return port

    async def stop(self) -> None:
        """SIGTERM to every worker (each drains its open streams), then wait for them."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            process = worker.process
            if process is None:
                continue
            try:
                await asyncio.wait_for(process.wait(), self._drain_timeout_s + 10)
            except TimeoutError:
                process.kill()
                await process.wait()
            if worker.output is not None:
                await worker.output
        if self._http is not None:
            await self._http.close()
        if self._session is not None:
            await self._session.close()

    async def _spawn(self, worker: _Worker) -> None:
        worker.metrics_port = None
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "slorouter.cli",
            *self._argv,
            "--worker-index",
            str(worker.index),
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=stop_with_parent,
        )
        worker.process = process
        assert process.stdout is not None
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                while worker.metrics_port is None:
                    line = (await process.stdout.readline()).decode()
                    if not line:
                        raise OSError(f"epp worker {worker.index} exited with status {await process.wait()}")
                    if line.startswith(READY_LINE):
                        worker.metrics_port = int(line[len(READY_LINE) :])
        except TimeoutError:
            process.kill()
            raise OSError(f"epp worker {worker.index} did not listen within {START_TIMEOUT_S:g} s") from None
        worker.output = asyncio.create_task(_drain(process.stdout), name=f"epp-worker-{worker.index}-out")

    async def _supervise(self) -> None:
        while True:
            for worker in self.workers:
                if worker.process is None:  # its restart failed: try again
                    await asyncio.sleep(RESTART_DELAY_S)
                    with contextlib.suppress(OSError):
                        await self._spawn(worker)
            waits = {
                asyncio.ensure_future(worker.process.wait()): worker
                for worker in self.workers
                if worker.process is not None
            }
            if not waits:
                continue
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for future in pending:
                future.cancel()
            for future in done:
                worker = waits[future]
                worker.restarts += 1
                log.error(
                    "epp worker %d exited with status %s; restarting it in %.0f s",
                    worker.index,
                    future.result(),
                    RESTART_DELAY_S,
                )
                await asyncio.sleep(RESTART_DELAY_S)
                try:
                    await self._spawn(worker)
                except OSError as exc:
                    log.error("epp worker %d could not be restarted: %s", worker.index, exc)
                    worker.process = None

    async def _fetch(self, worker: _Worker, path: str) -> tuple[int, str]:
        assert self._session is not None
        if worker.metrics_port is None or worker.process is None or worker.process.returncode is not None:
            return 0, ""
        try:
            async with self._session.get(f"http://127.0.0.1:{worker.metrics_port}{path}") as response:
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return 0, ""

    async def _metrics(self, _request: HttpRequest) -> Response:
        answers = await asyncio.gather(*(self._fetch(worker, "/metrics") for worker in self.workers))
        pages = [
            (str(worker.index), text)
            for worker, (status, text) in zip(self.workers, answers, strict=True)
            if status == 200
        ]
        body = merge_expositions(pages)
        restarts = "".join(
            f'slorouter_epp_worker_restarts_total{{worker="{worker.index}"}} {worker.restarts}\n'
            for worker in self.workers
        )
        body += (
            b"# HELP slorouter_epp_worker_restarts_total Times the supervisor restarted an epp worker.\n"
            b"# TYPE slorouter_epp_worker_restarts_total counter\n" + restarts.encode()
        )
        return Response(200, body, content_type=b"text/plain; charset=utf-8")

    async def _health(self, _request: HttpRequest) -> Response:
        alive = sum(1 for w in self.workers if w.process is not None and w.process.returncode is None)
        return json_response(
            json.dumps({"status": "ok", "workers": len(self.workers), "alive": alive}).encode()
        )

    async def _ready(self, _request: HttpRequest) -> Response:
        answers = await asyncio.gather(*(self._fetch(worker, "/ready") for worker in self.workers))
        ready = sum(1 for status, _ in answers if status == 200)
        if ready:
            body = {"status": "ready", "workers": len(self.workers), "ready": ready}
            return json_response(json.dumps(body).encode())
        return json_error(503, "no epp worker is ready", headers={"Retry-After": "1"})


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
