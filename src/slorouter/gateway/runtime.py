"""Running the HTTP gateway: the shared router assembly (``slorouter.serving.assembly``) plus its server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from slorouter.clock import Clock
from slorouter.config import Config, GatewayConfig
from slorouter.director import Director
from slorouter.discovery.start import DiscoveryHandle
from slorouter.gateway.app import Gateway
from slorouter.http.server import HttpServer, ServerLimits
from slorouter.metrics import GatewayMetrics
from slorouter.pool.kv_subscriber import KVEventSubscriber
from slorouter.pool.scraper import MetricsScraper
from slorouter.pool.state import PoolState
from slorouter.predictor.backend import LatencyPredictorBackend
from slorouter.serving.assembly import RouterCore
from slorouter.serving.recording import RecordSettings, TrafficRecorder

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)


@dataclass
class Router:
    """Everything one running gateway needs, built from a validated ``Config``."""

    core: RouterCore
    gateway: Gateway
    _server: HttpServer | None = field(default=None, repr=False)
    address: str = ""
    traffic: TrafficRecorder | None = None  # --record

    @classmethod
    def build(
        cls,
        config: Config,
        clock: Clock | None = None,
        *,
        config_path: str | Path | None = None,
        span_exporter: SpanExporter | None = None,
        record: RecordSettings | None = None,
    ) -> Router:
        """``config_path``: the file ``config`` was read from (None: the embedded default), which keys the
        embedded predictor's default state directory. ``span_exporter``: see ``RouterCore.build``.
        ``record``: record every request to a file (``slorouter.serving.recording``)."""
        core = RouterCore.build(config, clock, config_path=config_path, span_exporter=span_exporter)
        traffic = None if record is None else TrafficRecorder(record, core.clock)
        gateway = Gateway(
            config.gateway,
            core.director,
            core.metrics,
            core.clock,
            objectives=core.objectives,
            prediction_by_default=core.prediction_by_default,
            tracing=core.tracing,
            stats=core.stats,
            status=lambda: core.status("gateway"),
            traffic=traffic,
            window=None if core.tuning is None else core.tuning.window,
            actions=core.actions,
            engine_priority=core.engine_priority,
            audit=core.audit,
        )
        return cls(core, gateway, traffic=traffic)

    @property
    def config(self) -> Config:
        return self.core.config

    @property
    def pool(self) -> PoolState:
        return self.core.pool

    @property
    def director(self) -> Director:
        return self.core.director

    @property
    def scraper(self) -> MetricsScraper:
        return self.core.scraper

    @property
    def metrics(self) -> GatewayMetrics:
        return self.core.metrics

    @property
    def predictor(self) -> LatencyPredictorBackend | None:
        return self.core.predictor

    @property
    def kv_subscribers(self) -> list[KVEventSubscriber]:
        return self.core.kv_subscribers

    @property
    def discovery(self) -> DiscoveryHandle | None:
        return self.core.discovery

    async def start(self) -> None:
        """Open the recording, discover the pool, scrape every endpoint once, then serve; returns once the
        gateway listens."""
        if self.traffic is not None:
            self.traffic.open()
        await self.core.start()
        await self.gateway.open()
        self._server = self.gateway.build_server(server_limits(self.config.gateway))
        if self.config.gateway.max_concurrent_requests is None:
            self._server.concurrency_limit = derived_concurrency_limit(
                self.pool, flow_control=self.director.flow_control is not None
            )
        host, port = await self._server.start(self.config.gateway.host, self.config.gateway.port)
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        log.info("gateway listening on http://%s", self.address)

    async def drain(self, timeout_s: float) -> int:
        """Refuse new connections and let the requests in progress finish, for up to ``timeout_s`` (SIGTERM);
        returns how many were still running then (``stop`` cuts them)."""
        if self._server is None:
            return 0
        left = await self._server.drain(timeout_s)
        if left:
            log.warning("shutdown: %d requests still running after %g s are cut", left, timeout_s)
        return left

    async def stop(self) -> None:
        await self.core.stop()
        if self._server is not None:
            await self._server.close()
            self._server = None
        await self.gateway.close()
        if self.traffic is not None:
            self.traffic.close()


# Requests one engine runs at once (those beyond wait in its queue): the simulated profiles' max_num_seqs, a
# common vLLM setting. Engines configured for more need a larger gateway.max_concurrent_requests.
SLOTS_PER_ENDPOINT = 256


def derived_concurrency_limit(pool: PoolState, *, flow_control: bool) -> Callable[[], int]:
    """The default bound on requests handled at once: the pool's batch slots (``SLOTS_PER_ENDPOINT`` per
    endpoint, as endpoints come and go), twice that with flow control (as many again may wait in its
    queue). Beyond it a request would only wait in some queue longer than a client waits for a 503."""
    per_endpoint = SLOTS_PER_ENDPOINT * (2 if flow_control else 1)

    def limit() -> int:
        return per_endpoint * max(1, len(pool.endpoints))

    return limit


def server_limits(config: GatewayConfig) -> ServerLimits:
    """What the gateway's HTTP server allows its clients (slow heads and bodies, idle, sizes, connections,
    requests at once and read ahead, bytes)."""
    return ServerLimits(
        head_timeout_s=config.request_head_timeout_s,
        body_timeout_s=config.request_body_timeout_s,
        keepalive_timeout_s=config.keepalive_timeout_s,
        send_timeout_s=config.send_timeout_s,
        max_connections=config.max_connections,
        max_buffered_bytes=config.max_buffered_bytes,
        max_head_bytes=config.max_header_bytes,
        max_header_fields=config.max_header_fields,
        max_target_bytes=config.max_request_target_bytes,
        max_pipelined=config.max_pipelined_requests,
        # None: the derived bound the runtime sets on the server (``derived_concurrency_limit``).
        max_concurrent_requests=config.max_concurrent_requests or 1 << 31,
    )
