"""Running the endpoint picker: the shared router assembly, the ext_proc gRPC server, gRPC health on its own
port, and ``/metrics`` + ``/health`` + ``/ready`` over HTTP; graceful shutdown drains open streams."""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from slorouter.clock import Clock
from slorouter.config import Config
from slorouter.extproc.server import ExternalProcessor, Health, server_settings, start_health_server
from slorouter.extproc.stream import Picker
from slorouter.http.grpc_server import GrpcServer
from slorouter.http.server import HttpRequest, HttpServer, Response, json_error, json_response
from slorouter.pool.inflight_sharing import InFlightSharing
from slorouter.serving.assembly import RouterCore
from slorouter.serving.recording import RecordSettings, TrafficRecorder
from slorouter.serving.status import STATUS_PATH, encode_status

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)
T = TypeVar("T")
# What each of the picker's ports serves, by its field of ``PickerPorts``.
PORT_ROLES = {"grpc_port": "ext_proc gRPC", "health_port": "gRPC health", "metrics_port": "metrics"}


class PortUnavailable(OSError):
    """One of the picker's ports could not be bound; ``port_name`` is its field of ``PickerPorts``,
    ``in_use`` whether another socket listens there."""

    def __init__(self, message: str, port_name: str, in_use: bool) -> None:
        super().__init__(message)
        self.port_name = port_name
        self.in_use = in_use

    @classmethod
    def of(cls, port_name: str, host: str, port: int, reason: str, in_use: bool) -> PortUnavailable:
        return cls(f"cannot listen on {host}:{port} ({PORT_ROLES[port_name]}): {reason}", port_name, in_use)


@dataclass(frozen=True)
class PickerPorts:
    host: str = "127.0.0.1"
    grpc_port: int = 9002
    health_port: int = 9003
    metrics_port: int = 9090
    # A worker of ``slorouter epp --workers``: the ext_proc and health ports are shared (SO_REUSEPORT) and
    # its own /metrics listens on this host (its supervisor's metrics port is the pod's).
    shared: bool = False
    metrics_host: str | None = None


@dataclass
class EndpointPicker:
    core: RouterCore
    processor: ExternalProcessor
    health: Health
    ports: PickerPorts
    bound: PickerPorts | None = None  # the ports actually bound (0 picks free ones)
    sharing: InFlightSharing | None = None  # the in-flight view shared with other workers and replicas
    traffic: TrafficRecorder | None = None  # --record
    _grpc: GrpcServer | None = field(default=None, repr=False)
    _health_server: grpc.aio.Server | None = field(default=None, repr=False)
    _http: HttpServer | None = field(default=None, repr=False)

    @classmethod
    def build(
        cls,
        config: Config,
        ports: PickerPorts,
        clock: Clock | None = None,
        *,
        state_name: str = "epp",
        config_path: str | Path | None = None,
        span_exporter: SpanExporter | None = None,
        record: RecordSettings | None = None,
        data_plane_hedges: bool = True,
    ) -> EndpointPicker:
        """``span_exporter``: see ``RouterCore.build``. ``record``: record every request to a file
        (``slorouter.serving.recording``). ``data_plane_hedges``: the data plane retries on the pick's
        fallbacks (an override_host cluster), so hedges are armed for the objectives that hedge."""
        core = RouterCore.build(
            config, clock, state_name=state_name, config_path=config_path, span_exporter=span_exporter
        )
        traffic = None if record is None else TrafficRecorder(record, core.clock)
        picker = Picker(
            core.director,
            core.metrics,
            config.gateway,
            objectives=core.objectives,
            prediction_by_default=core.prediction_by_default,
            tracing=core.tracing,
            stats=core.stats,
            traffic=traffic,
            window=None if core.tuning is None else core.tuning.window,
            engine_priority=core.engine_priority,
            actions=core.actions,
            data_plane_hedges=data_plane_hedges,
            audit=core.audit,
        )
        processor = ExternalProcessor(picker)
        core.metrics.registry.register(_StreamsCollector(processor))
        return cls(core, processor, Health(core.director), ports, traffic=traffic)

    async def start(self) -> None:
        """Open the recording, scrape the pool once, then listen on the three ports."""
        if self.traffic is not None:
            self.traffic.open()
        await self.core.start()
        if self.sharing is not None:
            self.sharing.start()
        ports = self.ports
        self._grpc = GrpcServer(
            self.processor.methods,
            server_settings(self.core.config.gateway.max_body_bytes, shared=ports.shared),
        )
        grpc_port = await _bound(
            "grpc_port",
            ports.host,
            ports.grpc_port,
            self._grpc.start(ports.host, ports.grpc_port, reuse_port=ports.shared),
        )
        await self.health.start()
        self._health_server, health_port = await _bound(
            "health_port",
            ports.host,
            ports.health_port,
            start_health_server(self.health.servicer, ports.host, ports.health_port, reuse_port=ports.shared),
        )
        self._http = HttpServer(max_body_bytes=1024)
        self._http.add_route("GET", "/metrics", self._metrics)
        self._http.add_route("GET", "/health", self._liveness)
        self._http.add_route("GET", "/ready", self._readiness)
        self._http.add_route("GET", STATUS_PATH, self._status)
        metrics_host = ports.metrics_host or ports.host
        _, metrics_port = await _bound(
            "metrics_port",
            metrics_host,
            ports.metrics_port,
            self._http.start(metrics_host, ports.metrics_port),
        )
        self.bound = PickerPorts(
            ports.host, grpc_port, health_port, metrics_port, ports.shared, ports.metrics_host
        )
        log.info(
            "endpoint picker: ext_proc on %s:%d, gRPC health on :%d, metrics on :%d",
            ports.host,
            grpc_port,
            health_port,
            metrics_port,
        )

    async def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Health goes NOT_SERVING, new streams are refused, open ones get ``drain_timeout_s`` to end."""
        await self.health.shutdown()
        self.processor.accepting = False
        if self._grpc is not None:
            self._grpc.refuse_new_streams()  # GOAWAY: the data plane opens new streams elsewhere
        if drain_timeout_s > 0 and self.processor.active:
            log.info(
                "draining %d open ext_proc stream(s), up to %.1f s", self.processor.active, drain_timeout_s
            )
            if not await self.processor.drained(drain_timeout_s):
                log.warning("%d ext_proc stream(s) still open after the drain timeout", self.processor.active)
        if self._grpc is not None:
            await self._grpc.close(grace_s=0.5)
            self._grpc = None
        if self._health_server is not None:
            await self._health_server.stop(grace=0.5)
            self._health_server = None
        if self.sharing is not None:
            self.sharing.stop()
        if self._http is not None:
            await self._http.close()
            self._http = None
        await self.core.stop()
        if self.traffic is not None:
            self.traffic.close()

    async def _metrics(self, _request: HttpRequest) -> Response:
        return Response(200, self.core.metrics.render(), content_type=b"text/plain; charset=utf-8")

    async def _status(self, _request: HttpRequest) -> Response:
        return json_response(encode_status(self.core.status("picker")))

    async def _liveness(self, _request: HttpRequest) -> Response:
        return json_response(b'{"status": "ok"}')

    async def _readiness(self, _request: HttpRequest) -> Response:
        healthy = len(self.core.director.healthy_endpoints())
        if healthy and self.processor.accepting:
            return json_response(json.dumps({"status": "ready", "healthy_endpoints": healthy}).encode())
        return json_error(503, "no healthy model-server endpoint", headers={"Retry-After": "1"})


async def _bound(port_name: str, host: str, port: int, binding: Awaitable[T]) -> T:
    """What ``binding`` returns; its failure to bind as ``PortUnavailable``, which names the port."""
    try:
        return await binding
    except OSError as exc:
        # asyncio's message repeats the address: the errno's own words are enough beside ours (a failed
        # name lookup's errno is negative, its message its own).
        reason = os.strerror(exc.errno).lower() if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
        raise PortUnavailable.of(port_name, host, port, reason, exc.errno == errno.EADDRINUSE) from None


class _StreamsCollector(Collector):
    def __init__(self, processor: ExternalProcessor) -> None:
        self._processor = processor

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "slorouter_extproc_streams",
            "Open ext_proc streams (requests in the data plane).",
            self._processor.active,
        )
