"""The priority the picker puts in the request body (``pool.engine_priority``), in each ext_proc body mode:
BUFFERED answers with a body mutation and its content-length, FULL_DUPLEX_STREAMED streams the rewritten
body back; Envoy's fallbacks are the endpoints the one body fits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest

from slorouter.extproc.runtime import EndpointPicker
from slorouter.sim.server import SimCluster, start_pods
from tests.extproc.conftest import (
    DUPLEX,
    THREE_TARGETS,
    body_message,
    completion,
    destination_list,
    headers_message,
    open_call,
    request_headers,
    set_headers,
    start_picker,
)

OBJECTIVES = {"critical": {"priority": 5}}
CRITICAL = {"x-gateway-inference-objective": "critical"}


async def _channel_of(picker: EndpointPicker) -> grpc.aio.Channel:
    assert picker.bound is not None
    return grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}")


@pytest.fixture
async def vllm_picker(pods: SimCluster) -> AsyncIterator[EndpointPicker]:
    pool = {"model_server_type": "vllm", "engine_priority": True}
    running = await start_picker(list(pods.addresses), pool=pool, objectives=OBJECTIVES)
    try:
        yield running
    finally:
        await running.stop()


async def test_buffered_the_body_is_replaced_with_its_content_length(pods: SimCluster, vllm_picker):
    body = completion(pods.model)
    async with await _channel_of(vllm_picker) as channel:
        call = open_call(channel)
        headers = request_headers(**CRITICAL, **{"content-length": str(len(body))})
        await call.send(headers_message(headers), body_message(body))
        _, routed = await call.receive(2)
        common = routed.request_body.response
        sent = common.body_mutation.body
        assert json.loads(sent) == {"priority": -5, **json.loads(body)}
        assert set_headers(common.header_mutation)["content-length"] == str(len(sent))
        call.call.cancel()

        # Without a content-length (a chunked upload) Envoy frames the new body itself.
        call = open_call(channel)
        await call.send(headers_message(request_headers()), body_message(body))
        _, routed = await call.receive(2)
        common = routed.request_body.response
        assert json.loads(common.body_mutation.body)["priority"] == 0
        assert "content-length" not in set_headers(common.header_mutation)
        call.call.cancel()


async def test_full_duplex_the_rewritten_body_is_streamed_back(pods: SimCluster, vllm_picker):
    body = completion(pods.model)
    async with await _channel_of(vllm_picker) as channel:
        call = open_call(channel)
        await call.send(
            headers_message(request_headers(**CRITICAL), request_mode=DUPLEX, response_mode=DUPLEX)
        )
        await call.send(body_message(body[:10], end_of_stream=False), body_message(body[10:]))
        headers, passed = await call.receive(2)
        assert headers.WhichOneof("response") == "request_headers"
        streamed = passed.request_body.response.body_mutation.streamed_response
        assert streamed.end_of_stream
        assert streamed.body == b'{"priority":-5,' + body[1:]
        call.call.cancel()


async def test_without_engine_priority_the_body_is_not_touched(pods: SimCluster, picker, channel):
    call = open_call(channel)
    await call.send(headers_message(request_headers(**CRITICAL)), body_message(completion(pods.model)))
    _, routed = await call.receive(2)
    assert not routed.request_body.response.HasField("body_mutation")
    call.call.cancel()


async def test_the_fallbacks_take_the_priority_as_the_pick_does():
    pods = await start_pods(4, 0, "llama3-8b-h100", seed=1, engines=("vllm", "vllm", "sglang", "sglang"))
    kinds = dict(zip(pods.addresses, ("vllm", "vllm", "sglang", "sglang"), strict=True))
    pool = {
        "endpoints": [{"address": a, "model_server_type": kind} for a, kind in kinds.items()],
        "engine_priority": True,
    }
    picker = await start_picker([], pool=pool, scheduler=THREE_TARGETS, objectives=OBJECTIVES)
    try:
        seen = set()
        async with await _channel_of(picker) as channel:
            for i in range(16):
                call = open_call(channel)
                body = completion(pods.model, prompt=f"request {i}")
                await call.send(headers_message(request_headers(**CRITICAL)), body_message(body))
                _, routed = await call.receive(2)
                endpoints = destination_list(routed)
                kind = kinds[endpoints[0]]
                assert {kinds[e] for e in endpoints} == {kind}  # one body fits them all
                assert len(endpoints) in (1, 2)  # three targets of two vLLM and two SGLang: mixed
                priority = json.loads(routed.request_body.response.body_mutation.body)["priority"]
                assert priority == (-5 if kind == "vllm" else 5)
                seen.add(kind)
                call.call.cancel()
        assert seen == {"vllm", "sglang"}
    finally:
        await picker.stop()
        await pods.close()
