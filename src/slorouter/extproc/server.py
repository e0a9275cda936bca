"""The ext_proc service over ``PickerStream`` (on the lean gRPC server), its gRPC health service (grpcio), and
draining on shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import socket
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from slorouter.director import Director
from slorouter.eager import Pending, start_eagerly
from slorouter.extproc import messages
from slorouter.extproc.observer import ResponseObserver
from slorouter.extproc.stream import Picker, PickerStream, ProtocolError
from slorouter.http.grpc_server import (
    INTERNAL,
    INVALID_ARGUMENT,
    UNAVAILABLE,
    HandlerFactory,
    Push,
    Replies,
    RpcError,
    RpcHandler,
    ServerSettings,
)

log = logging.getLogger(__name__)

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = ("", "liveness")
READINESS = ("readiness", EXT_PROC_SERVICE)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# How often readiness follows the pool (an endpoint turning healthy or unhealthy).
READINESS_INTERVAL_S = 0.1


PROCESS_METHOD = f"/{EXT_PROC_SERVICE}/Process"
# Streams a worker of ``slorouter epp --workers`` takes on one connection before the data plane opens
# another (which the kernel may give another worker).
WORKER_MAX_CONCURRENT_STREAMS = 64


def server_settings(max_body_bytes: int, *, shared: bool = False) -> ServerSettings:
    """Room for a whole request body in one message, plus the protocol's framing; a worker sharing the
    port with others takes few streams per connection, so that the data plane opens several."""
    settings = ServerSettings(max_message_bytes=max_body_bytes + (1 << 20))
    if shared:
        settings = dataclasses.replace(settings, max_concurrent_streams=WORKER_MAX_CONCURRENT_STREAMS)
    return settings


class ExternalProcessor:
    """``envoy.service.ext_proc.v3.ExternalProcessor/Process``: one ``PickerStream`` per stream, served by
    the lean gRPC server (``slorouter.http.grpc_server``)."""

    def __init__(self, picker: Picker) -> None:
        self._picker = picker
        self.accepting = True
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def methods(self) -> dict[str, HandlerFactory]:
        return {PROCESS_METHOD: self.open_stream}

    def open_stream(self, fields: Mapping[bytes, bytes], push: Push) -> RpcHandler:
        """A stream's handler, by the role the data plane's filter declares in its gRPC metadata: picking
        (answering the request, and the response unless it is observed), or observing a response. ``push``
        sends the picker's answers that reply to no message (a deadline's immediate response)."""
        if not self.accepting:
            raise RpcError(UNAVAILABLE, "the endpoint picker is shutting down")
        self.active += 1
        self._idle.clear()
        role = fields.get(messages.RESPONSE_PATH)
        stream: _Stream
        if role == messages.OBSERVER:
            stream = ResponseObserver(self._picker)
        else:
            stream = PickerStream(
                self._picker,
                observed=role == messages.OBSERVED,
                push=lambda responses: push([messages.serialized(response) for response in responses]),
            )
        return _ProcessStream(self, stream)

    def stream_closed(self) -> None:
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


class _Stream(Protocol):
    closed: bool

    def step(self, message: Any) -> list[Any] | Awaitable[list[Any]]: ...

    def close(self, reason: str) -> None: ...


class _ProcessStream:
    """One ``Process`` RPC: Envoy's messages parsed, answered by the ``PickerStream`` (or observed by the
    ``ResponseObserver``), answers serialized."""

    __slots__ = ("_error", "_processor", "_stream")

    def __init__(self, processor: ExternalProcessor, stream: _Stream) -> None:
        self._processor = processor
        self._stream = stream
        self._error: str | None = None  # why this side ended the stream with an error status

    @property
    def finished(self) -> bool:
        return self._stream.closed

    def on_message(self, payload: bytes) -> Replies | Awaitable[Replies]:
        try:
            message = messages.ProcessingRequest.FromString(payload)
        except DecodeError as exc:
            raise self._protocol_error(f"not a ProcessingRequest ({exc})") from None
        try:
            result = self._stream.step(message)
        except ProtocolError as exc:
            raise self._protocol_error(str(exc)) from None
        if isinstance(result, list):
            return [messages.serialized(response) for response in result]
        if inspect.iscoroutine(result):
            # Routing rarely waits (only on a remote predictor): answered in this pass when it does not.
            try:
                value = start_eagerly(result)
            except Exception as exc:
                raise self._failure(exc) from None
            if isinstance(value, Pending):
                return self._later(value.resume())
            return [messages.serialized(response) for response in value]
        return self._later(result)

    async def _later(self, pending: Awaitable[list[Any]]) -> Replies:
        try:
            responses = await pending
        except Exception as exc:
            raise self._failure(exc) from None
        return [messages.serialized(response) for response in responses]

    def _failure(self, exc: Exception) -> RpcError:
        if isinstance(exc, ProtocolError):
            return self._protocol_error(str(exc))
        self._error = f"endpoint picker error: {exc.__class__.__name__}"
        log.error("ext_proc stream failed", exc_info=exc)
        return RpcError(INTERNAL, f"{self._error}: {exc}")

    def _protocol_error(self, message: str) -> RpcError:
        self._error = f"ext_proc protocol error: {message}"
        log.warning("%s", self._error)
        return RpcError(INVALID_ARGUMENT, message)

    def on_close(self, reason: str | None) -> None:
        # A client gone, an upstream reset and a cancelled stream all look alike here: the requests end.
        try:
            self._stream.close(self._error or reason or "the ext_proc stream ended before the response did")
        finally:
            self._processor.stream_closed()


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


async def start_health_server(
    servicer: Any, host: str, port: int, *, reuse_port: bool = False
) -> tuple[grpc.aio.Server, int]:
    """grpcio's server for ``grpc.health.v1`` (probes, not the data path), listening; it and its port."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuse_port))])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        raise _bind_error(host, port, reuse_port)
    await server.start()
    return server, bound


def _bind_error(host: str, port: int, reuse_port: bool) -> OSError:
    """Why grpcio could not bind ``host:port`` (it does not say): the error of the same bind, made here."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        socket.create_server((host, port), family=family, reuse_port=reuse_port).close()
    except OSError as exc:
        return exc
    return OSError("grpcio could not bind it")
