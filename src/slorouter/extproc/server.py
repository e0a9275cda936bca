"""The ext_proc gRPC service over ``PickerStream``, its gRPC health service, and draining on shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from slorouter.director import Director
from slorouter.extproc.stream import Picker, PickerStream, ProtocolError

log = logging.getLogger(__name__)

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = ("", "liveness")
READINESS = ("readiness", EXT_PROC_SERVICE)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# How often readiness follows the pool (an endpoint turning healthy or unhealthy).
READINESS_INTERVAL_S = 0.1


def grpc_options(max_body_bytes: int) -> list[tuple[str, int]]:
    """Room for a whole request body in one message, plus the protocol's framing."""
    size = max_body_bytes + (1 << 20)
    return [
        ("grpc.max_receive_message_length", size),
        ("grpc.max_send_message_length", size),
        ("grpc.so_reuseport", 0),
    ]


class ExternalProcessor(external_processor_pb2_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """``envoy.service.ext_proc.v3.ExternalProcessor``: one ``PickerStream`` per ``Process`` stream."""

    def __init__(self, picker: Picker) -> None:
        self._picker = picker
        self.accepting = True
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def Process(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        if not self.accepting:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the endpoint picker is shutting down")
        stream = PickerStream(self._picker)
        self.active += 1
        self._idle.clear()
        # A client gone, an upstream reset and a cancelled stream all look alike here: the requests end.
        reason = "the ext_proc stream ended before the response did"
        try:
            async for message in requests:
                try:
                    responses = await stream.handle(message)
                except ProtocolError as exc:
                    reason = f"ext_proc protocol error: {exc}"
                    log.warning("%s", reason)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                for response in responses:
                    yield response
                if stream.closed:
                    return
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            reason = f"endpoint picker error: {exc.__class__.__name__}"
            log.exception("ext_proc stream failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"{reason}: {exc}")
        finally:
            stream.close(reason)
            self.active -= 1
            if not self.active:
                self._idle.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no stream is open (True), or ``timeout_s`` passed (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class Health:
    """``grpc.health.v1``: liveness ("" and "liveness") is SERVING while the process runs; readiness
    ("readiness" and the ext_proc service name) is SERVING while the pool has a healthy endpoint and the
    picker is not shutting down."""

    def __init__(self, director: Director) -> None:
        self.servicer = health_aio.HealthServicer()
        self._director = director
        self._ready: bool | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for service in LIVENESS:
            await self.servicer.set(service, SERVING)
        await self.update()
        self._task = asyncio.create_task(self._follow_pool(), name="epp-readiness")

    async def update(self) -> None:
        ready = bool(self._director.healthy_endpoints())
        if ready != self._ready:
            self._ready = ready
            for service in READINESS:
                await self.servicer.set(service, SERVING if ready else NOT_SERVING)
            log.info("readiness: %s", "SERVING" if ready else "NOT_SERVING (no healthy endpoint)")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        await self.servicer.enter_graceful_shutdown()

    async def _follow_pool(self) -> None:
        while True:
            await asyncio.sleep(READINESS_INTERVAL_S)
            await self.update()


async def start_grpc_server(
    servicers: list[Any], host: str, port: int, options: list[tuple[str, int]]
) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server with the given servicers, listening; returns it and its port."""
    server = grpc.aio.server(options=options)
    for servicer in servicers:
        if isinstance(servicer, ExternalProcessor):
            external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
        else:
            health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"cannot listen on {host}:{port} for gRPC")
    await server.start()
    return server, bound
