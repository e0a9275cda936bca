"""The endpoint picker on 127.0.0.1 over a real grpc.aio channel; ext_proc messages as Envoy sends them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from google.protobuf import struct_pb2

from slorouter.config import parse_config
from slorouter.extproc import messages
from slorouter.extproc.runtime import EndpointPicker, PickerPorts
from slorouter.sim.server import SimCluster, start_pods

BUFFERED = messages.BUFFERED
DUPLEX = messages.FULL_DUPLEX_STREAMED
STREAMED = messages.STREAMED
NONE = messages.NONE
# A heuristic scheduler whose picks list three endpoints: the pick, then two fallbacks.
THREE_TARGETS = {
    "plugins": [
        {"type": "queue-scorer"},
        {"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 3}},
    ],
    "schedulingProfiles": [
        {"name": "default", "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "max-score-picker"}]}
    ],
}


@pytest.fixture
async def pods() -> AsyncIterator[SimCluster]:
    cluster = await start_pods(3, 0, "llama3-8b-h100", seed=1)
    try:
        yield cluster
    finally:
        await cluster.close()


async def start_picker(endpoints: list[str], **overrides: Any) -> EndpointPicker:
    data: dict[str, Any] = {
        "pool": {"endpoints": endpoints, "scrape_interval_ms": 20, **overrides.pop("pool", {})},
        "seed": 7,
        **overrides,
    }
    picker = EndpointPicker.build(parse_config(data), PickerPorts("127.0.0.1", 0, 0, 0))
    await picker.start()
    return picker


@pytest.fixture
async def picker(pods: SimCluster) -> AsyncIterator[EndpointPicker]:
    running = await start_picker(list(pods.addresses))
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def channel(picker: EndpointPicker) -> AsyncIterator[grpc.aio.Channel]:
    assert picker.bound is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as chan:
        yield chan


def headers_message(
    headers: dict[str, str],
    *,
    end_of_stream: bool = False,
    request_mode: int = BUFFERED,
    response_mode: int = STREAMED,
    subset: Any = None,
    protocol_config: bool = True,
) -> Any:
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )
    message = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream)
    )
    if protocol_config:
        message.protocol_config.CopyFrom(
            pb.ProtocolConfiguration(request_body_mode=request_mode, response_body_mode=response_mode)
        )
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({messages.SUBSET_KEY: subset})
        message.metadata_context.filter_metadata[messages.SUBSET_NAMESPACE].CopyFrom(hint)
    return message


def request_headers(path: str = "/v1/completions", method: str = "POST", **extra: str) -> dict[str, str]:
    return {":method": method, ":path": path, ":authority": "gw", "content-type": "application/json", **extra}


def body_message(body: bytes, end_of_stream: bool = True) -> Any:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=end_of_stream))


def response_headers_message(
    status: int = 200,
    content_type: str = "application/json",
    served: str | None = None,
    flags: str | None = None,
) -> Any:
    headers = [
        base_pb2.HeaderValue(key=":status", raw_value=str(status).encode()),
        base_pb2.HeaderValue(key="content-type", raw_value=content_type.encode()),
    ]
    if served is not None:  # what Envoy adds with the bootstrap's response_headers_to_add
        headers.append(base_pb2.HeaderValue(key=messages.SERVED, raw_value=served.encode()))
    if flags is not None:
        headers.append(base_pb2.HeaderValue(key=messages.RESPONSE_FLAGS, raw_value=flags.encode()))
    header_map = base_pb2.HeaderMap(headers=headers)
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=header_map))


def response_body_message(body: bytes, end_of_stream: bool) -> Any:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=body, end_of_stream=end_of_stream))


def completion(model: str, prompt: str = "Hello there", **extra: Any) -> bytes:
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": 4, **extra}).encode()


@dataclass
class Call:
    """One ``Process`` stream, driven message by message as Envoy would."""

    call: Any

    async def send(self, *requests: Any) -> None:
        for request in requests:
            await self.call.write(request)

    async def receive(self, count: int = 1) -> list[Any]:
        return [await self.call.read() for _ in range(count)]

    async def end(self) -> None:
        await self.call.done_writing()


def open_call(channel: grpc.aio.Channel) -> Call:
    return Call(external_processor_pb2_grpc.ExternalProcessorStub(channel).Process())


def set_headers(mutation: Any) -> dict[str, str]:
    return {
        o.header.key: (o.header.raw_value or o.header.value.encode()).decode() for o in mutation.set_headers
    }


def destination_list(response: Any) -> list[str]:
    value = response.dynamic_metadata.fields[messages.LB_NAMESPACE].struct_value.fields[messages.DESTINATION]
    return value.string_value.split(",")


def immediate_of(response: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    assert response.WhichOneof("response") == "immediate_response", response
    immediate = response.immediate_response
    return immediate.status.code, set_headers(immediate.headers), json.loads(immediate.body)


def split(body: bytes, size: int) -> Iterable[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]
