"""The ext_proc message handling, driven through a real grpc.aio channel against the picker on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slorouter.extproc import messages
from slorouter.extproc import stream as stream_module
from slorouter.extproc.runtime import EndpointPicker
from slorouter.scheduling.plugin import Admitter, Plugin
from slorouter.scheduling.types import AdmissionDeniedError, Candidates, InferenceRequest
from slorouter.sim.server import SimCluster
from tests.extproc.conftest import (
    BUFFERED,
    DUPLEX,
    NONE,
    STREAMED,
    THREE_TARGETS,
    Call,
    body_message,
    completion,
    destination_list,
    headers_message,
    immediate_of,
    open_call,
    request_headers,
    response_body_message,
    response_headers_message,
    set_headers,
    split,
    start_picker,
)
from tests.gateway.conftest import eventually


def _idle(picker: EndpointPicker) -> bool:
    return int(picker.core.pool.columns["inflight_requests"].sum()) == 0


def _metric(picker: EndpointPicker, prefix: str) -> float:
    for line in picker.core.metrics.render().decode().splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_buffered_request_is_routed_and_its_response_observed(pods: SimCluster, picker, channel):
    call = open_call(channel)
    await call.send(headers_message(request_headers()))
    (first,) = await call.receive()
    assert first.WhichOneof("response") == "request_headers"  # BUFFERED: continue, the body decides
    await call.send(body_message(completion(pods.model)))
    (routed,) = await call.receive()
    assert routed.WhichOneof("response") == "request_body"
    mutation = set_headers(routed.request_body.response.header_mutation)
    target = mutation["x-gateway-destination-endpoint"]
    assert target in pods.addresses
    assert destination_list(routed) == [target]
    assert mutation["x-request-id"].startswith("slr-")
    assert not _idle(picker)  # in flight on its target until the response ends
    await call.send(response_headers_message())
    (answered,) = await call.receive()
    own = set_headers(answered.response_headers.response.header_mutation)
    assert own["x-slorouter-endpoint"] == target
    assert own["x-slorouter-route"] == "heuristic"
    assert not answered.HasField("mode_override")  # the prefix index reads the reply: the body is wanted
    reply = b'{"choices": [{"text": "hi"}], "usage": {"completion_tokens": 4}}'
    await call.send(response_body_message(reply[:10], False), response_body_message(reply[10:], True))
    passed = await call.receive(2)
    assert [r.WhichOneof("response") for r in passed] == ["response_body", "response_body"]
    assert not any(r.response_body.response.HasField("body_mutation") for r in passed)  # STREAMED: as is
    await call.end()
    assert _idle(picker)
    assert _metric(picker, "inference_objective_request_ttft_seconds_count{") == 1.0
    assert _metric(picker, f'slorouter_requests_total{{code="200",endpoint="{target}"}}') == 1.0


async def test_a_response_body_no_hook_reads_is_not_asked_for(pods: SimCluster, picker, channel):
    call = open_call(channel)
    # n = 2: no conversation continues from this reply, so nothing reads the (non-SSE) body.
    await call.send(headers_message(request_headers()), body_message(completion(pods.model, n=2)))
    await call.receive(2)
    await call.send(response_headers_message())
    (answered,) = await call.receive()
    assert answered.mode_override.response_body_mode == NONE
    assert answered.mode_override.request_body_mode == BUFFERED  # the request's mode is left alone
    assert _idle(picker)  # done for the picker at the headers, as for the gateway's relay
    # Envoy sends the body all the same when its filter does not allow mode overrides: passed on as is.
    await call.send(response_body_message(b'{"choices": []}', True))
    (passed,) = await call.receive()
    assert passed.WhichOneof("response") == "response_body"
    await call.end()
    assert _metric(picker, "inference_objective_request_ttft_seconds_count{") == 1.0


async def test_full_duplex_body_split_at_every_chunk_size(pods: SimCluster, picker, channel):
    body = completion(pods.model, prompt="split me")
    for size in range(1, len(body) + 1):
        call = open_call(channel)
        await call.send(headers_message(request_headers(), request_mode=DUPLEX, response_mode=DUPLEX))
        chunks = list(split(body, size))
        for i, chunk in enumerate(chunks):
            await call.send(body_message(chunk, end_of_stream=i == len(chunks) - 1))
        headers, passed = await call.receive(2)
        assert headers.WhichOneof("response") == "request_headers", size
        mutation = set_headers(headers.request_headers.response.header_mutation)
        assert mutation["x-gateway-destination-endpoint"] in pods.addresses
        streamed = passed.request_body.response.body_mutation.streamed_response
        assert (streamed.body, streamed.end_of_stream) == (body, True), size
        call.call.cancel()
    await eventually(lambda: _idle(picker))
    assert _metric(picker, "slorouter_inflight_handles ") == 0.0


async def test_full_duplex_sse_response_is_passed_on_and_counted(pods: SimCluster, picker, channel):
    call = open_call(channel)
    await call.send(
        headers_message(request_headers(), request_mode=DUPLEX, response_mode=DUPLEX),
        body_message(completion(pods.model, stream=True)),
    )
    await call.receive(2)
    await call.send(response_headers_message(content_type="text/event-stream"))
    await call.receive()
    events = b"".join(b'data: {"choices": [{"text": "t%d"}]}\n\n' % i for i in range(5)) + b"data: [DONE]\n\n"
    chunks = list(split(events, 7))  # split inside events and inside "data: [DONE]"
    for i, chunk in enumerate(chunks):
        await call.send(response_body_message(chunk, end_of_stream=i == len(chunks) - 1))
    echoed = await call.receive(len(chunks))
    streamed = [r.response_body.response.body_mutation.streamed_response for r in echoed]
    assert b"".join(s.body for s in streamed) == events
    assert [s.end_of_stream for s in streamed] == [False] * (len(chunks) - 1) + [True]
    await call.end()
    assert _idle(picker)
    assert _metric(picker, "inference_objective_request_tpot_seconds_count{") == 1.0


async def test_the_subset_hint_limits_the_pick(pods: SimCluster, picker, channel):
    for subset, allowed in (
        ([pods.addresses[1]], {pods.addresses[1]}),
        (f"{pods.addresses[2]},{pods.addresses[0]}", {pods.addresses[0], pods.addresses[2]}),
        (["127.0.0.1"], set(pods.addresses)),  # an ip alone matches every port on it
    ):
        for _ in range(4):
            call = open_call(channel)
            await call.send(
                headers_message(request_headers(), subset=subset), body_message(completion(pods.model))
            )
            _, routed = await call.receive(2)
            assert set(destination_list(routed)) <= allowed
            call.call.cancel()
    call = open_call(channel)
    await call.send(
        headers_message(request_headers(), subset=["10.9.9.9:8000"]), body_message(completion(pods.model))
    )
    _, refused = await call.receive(2)
    status, headers, body = immediate_of(refused)
    assert status == 503 and headers["retry-after"] == "1"
    assert "subset hint (10.9.9.9:8000)" in body["error"]["message"]
    await eventually(lambda: _idle(picker))


async def test_fallbacks_are_listed_in_order_after_the_pick(pods: SimCluster):
    picker = await start_picker(list(pods.addresses), scheduler=THREE_TARGETS)
    assert picker.bound is not None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            call = open_call(channel)
            await call.send(headers_message(request_headers()), body_message(completion(pods.model)))
            _, routed = await call.receive(2)
            endpoints = destination_list(routed)
            assert sorted(endpoints) == sorted(pods.addresses)
            header = set_headers(routed.request_body.response.header_mutation)[
                "x-gateway-destination-endpoint"
            ]
            assert header == endpoints[0]
            call.call.cancel()
    finally:
        await picker.stop()


class _ShedSheddable(Plugin, Admitter):
    """Sheds every sheddable request with an SLO, with the headers the latency-slo-admitter sends."""

    type_name = "test-shed-sheddable"

    def admit(self, request: InferenceRequest, candidates: Candidates) -> None:
        if request.sheddable and request.has_slo:
            raise AdmissionDeniedError(
                "sheddable request dropped",
                headers={"Retry-After": "1", "x-slorouter-dropped-reason": "slo-unattainable"},
            )


async def test_a_shed_request_is_a_429_immediate_response(pods: SimCluster):
    picker = await start_picker(list(pods.addresses), objectives={"batch": {"priority": -1}})
    picker.core.director.setup.admitters.append(_ShedSheddable("shed", None, None))  # type: ignore[arg-type]
    assert picker.bound is not None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            call = open_call(channel)
            headers = request_headers(
                **{"x-llm-d-slo-ttft-ms": "1", "x-gateway-inference-objective": "batch"}
            )
            await call.send(headers_message(headers), body_message(completion(pods.model)))
            _, shed = await call.receive(2)
            status, response_headers, body = immediate_of(shed)
            assert status == 429
            assert response_headers["x-slorouter-dropped-reason"] == "slo-unattainable"
            assert response_headers["retry-after"] == "1"
            assert response_headers["content-type"] == "application/json"
            assert (
                body["error"]["type"] == "RateLimitError" and body["error"]["code"] == "rate_limit_exceeded"
            )
        assert _idle(picker)
        assert _metric(picker, 'slorouter_requests_total{code="429",endpoint="none"}') == 1.0
    finally:
        await picker.stop()


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b'{"model": "m", "prompt": ', 400, "not valid JSON"),
        (b'{"prompt": "x"}', 400, "model"),
        (b"", 400, ""),
    ],
)
async def test_bad_bodies_are_400s_with_the_gateways_message(pods, picker, channel, body, status, needle):
    call = open_call(channel)
    await call.send(headers_message(request_headers(), request_mode=DUPLEX), body_message(body))
    (answer,) = await call.receive()
    code, _, error = immediate_of(answer)
    assert code == status and needle in error["error"]["message"]
    assert error["error"]["type"] == "BadRequestError"


async def test_a_body_not_declared_json_is_415_as_at_the_gateway(pods, picker, channel):
    call = open_call(channel)
    headers = request_headers(**{"content-type": "text/plain"})
    await call.send(
        headers_message(headers, request_mode=DUPLEX), body_message(b'{"model": "m", "prompt": "x"}')
    )
    (answer,) = await call.receive()
    code, _, error = immediate_of(answer)
    assert code == 415 and error["error"]["type"] == "UnsupportedMediaTypeError"
    assert error["error"]["message"].startswith("Content-Type 'text/plain' is not supported")


async def test_requests_that_cannot_be_routed_are_named(pods, picker, channel):
    cases = [
        (headers_message({":method": "POST"}), 400, "no :path pseudo-header"),
        (headers_message({":path": "/v1/completions"}), 400, "no :method pseudo-header"),
        (headers_message(request_headers("/v2/anything")), 404, "no route for POST /v2/anything"),
        (headers_message(request_headers(method="GET")), 405, "takes POST, not GET"),
        (headers_message(request_headers(), end_of_stream=True), 400, "request body"),
        (
            headers_message(request_headers(), request_mode=STREAMED),
            500,
            "request_body_mode BUFFERED or FULL_DUPLEX",
        ),
    ]
    for message, status, needle in cases:
        call = open_call(channel)
        await call.send(message)
        (answer,) = await call.receive()
        code, _, error = immediate_of(answer)
        assert (code, needle in error["error"]["message"]) == (status, True), error


async def test_an_oversized_body_is_a_413(pods: SimCluster):
    picker = await start_picker(list(pods.addresses), gateway={"max_body_bytes": 1024})
    assert picker.bound is not None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            call = open_call(channel)
            await call.send(headers_message(request_headers(), request_mode=DUPLEX))
            await call.send(body_message(b"x" * 600, False), body_message(b"x" * 600, False))
            (answer,) = await call.receive()
            code, _, error = immediate_of(answer)
            assert code == 413 and "larger than the limit of 1024 bytes" in error["error"]["message"]
    finally:
        await picker.stop()


async def test_messages_out_of_order_are_grpc_errors_naming_the_problem(pods, picker, channel):
    for sequence, needle in (
        ([body_message(b"{}")], "request body arrived before the request headers"),
        ([response_body_message(b"x", True)], "response body arrived before the response headers"),
    ):
        call = open_call(channel)
        await call.send(*sequence)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.receive()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in (info.value.details() or "")
    call = open_call(channel)
    await call.send(headers_message(request_headers()), body_message(completion(pods.model)))
    await call.receive(2)
    await call.send(headers_message(request_headers()))  # headers again, once routed
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.receive()
    assert "request headers arrived again" in (info.value.details() or "")
    await eventually(lambda: _idle(picker))  # the routed request was released when the stream failed


async def test_an_early_end_releases_the_in_flight_load_once(pods, picker, channel):
    # Cancelled mid-response (Envoy resets the stream: client gone), and half-closed before the response.
    cancelled = open_call(channel)
    await cancelled.send(headers_message(request_headers()), body_message(completion(pods.model)))
    await cancelled.receive(2)
    await cancelled.send(response_headers_message(content_type="text/event-stream"))
    await cancelled.receive()
    await cancelled.send(response_body_message(b'data: {"choices": []}\n\n', False))
    await cancelled.receive()
    half_closed = open_call(channel)
    await half_closed.send(headers_message(request_headers()), body_message(completion(pods.model)))
    await half_closed.receive(2)
    assert int(picker.core.pool.columns["inflight_requests"].sum()) == 2
    cancelled.call.cancel()
    await half_closed.end()
    await eventually(lambda: _idle(picker))
    await asyncio.sleep(0.1)
    assert int(picker.core.pool.columns["inflight_requests"].min()) == 0  # never released twice
    assert _metric(picker, "slorouter_inflight_handles ") == 0.0
    assert _metric(picker, "slorouter_client_disconnects_total ") == 2.0


async def test_get_models_goes_to_a_healthy_endpoint(pods, picker, channel):
    call = open_call(channel)
    await call.send(headers_message(request_headers("/v1/models?x=1", "GET"), end_of_stream=True))
    (routed,) = await call.receive()
    assert destination_list(routed)[0] in pods.addresses


async def _health(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status


async def test_health_follows_the_pool_and_shutdown(pods: SimCluster):
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    picker = await start_picker(["127.0.0.1:1"], pool={"unhealthy_after_failures": 1})
    assert picker.bound is not None
    port = picker.bound.health_port
    try:
        assert await _health(port, "") == serving
        assert await _health(port, "liveness") == serving
        assert await _health(port, "readiness") == not_serving
        assert await _health(port, "envoy.service.ext_proc.v3.ExternalProcessor") == not_serving
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            call = open_call(channel)
            await call.send(headers_message(request_headers()), body_message(completion(pods.model)))
            _, answer = await call.receive(2)
            status, headers, error = immediate_of(answer)
            assert status == 503 and headers["retry-after"] == "1"
            assert "no healthy model-server endpoint" in error["error"]["message"]
    finally:
        await picker.stop()
    picker = await start_picker(list(pods.addresses))
    assert picker.bound is not None
    port = picker.bound.health_port
    try:
        assert await _health(port, "readiness") == serving
        assert await _health(port, "envoy.service.ext_proc.v3.ExternalProcessor") == serving
        await picker.health.shutdown()
        assert await _health(port, "readiness") == not_serving
        assert await _health(port, "") == not_serving
    finally:
        await picker.stop()


async def test_shutdown_drains_open_streams_and_refuses_new_ones(pods: SimCluster):
    picker = await start_picker(list(pods.addresses))
    assert picker.bound is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
        call = open_call(channel)
        await call.send(headers_message(request_headers()), body_message(completion(pods.model)))
        await call.receive(2)
        stopping = asyncio.create_task(picker.stop(drain_timeout_s=10))
        await eventually(lambda: not picker.processor.accepting)
        # A new stream is refused before its first message (grpcio's client would report a message written
        # after that answer as its own INTERNAL error, so none is written).
        refused = open_call(channel)
        await refused.call.done_writing()
        assert await refused.call.code() == grpc.StatusCode.UNAVAILABLE
        assert not stopping.done()  # still draining the open stream
        await call.send(response_headers_message())
        await call.receive()
        await call.send(response_body_message(json.dumps({"choices": []}).encode(), True))
        await call.receive()
        await call.end()
        await asyncio.wait_for(stopping, 10)
    assert _idle(picker)


async def test_the_response_body_is_asked_for_when_envoy_does_not_say_it_sends_it(pods, picker, channel):
    for message in (
        headers_message(request_headers(), protocol_config=False),  # an Envoy that sends no protocol_config
        headers_message(request_headers(), response_mode=NONE),  # a filter without response body processing
    ):
        call = open_call(channel)
        await call.send(message)
        (answer,) = await call.receive()
        assert answer.mode_override.response_body_mode == STREAMED
        assert answer.mode_override.request_body_mode == BUFFERED
        call.call.cancel()
    call = open_call(channel)
    await call.send(headers_message(request_headers(), response_mode=STREAMED))
    (answer,) = await call.receive()
    assert not answer.HasField("mode_override")


async def test_a_get_of_the_models_with_a_body_passes_through(pods, picker, channel):
    call = open_call(channel)
    await call.send(headers_message(request_headers("/v1/models", "GET")), body_message(b"ignored"))
    routed, passed = await call.receive(2)
    assert destination_list(routed)[0] in pods.addresses
    assert passed.WhichOneof("response") == "request_body"
    await call.send(response_headers_message())
    (answer,) = await call.receive()
    assert answer.WhichOneof("response") == "response_headers"
    await call.end()
    assert _idle(picker)


async def test_api_keys_are_checked_and_not_forwarded(pods: SimCluster):
    picker = await start_picker(list(pods.addresses), gateway={"api_keys": ["sk-1"]})
    assert picker.bound is not None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            call = open_call(channel)
            await call.send(headers_message(request_headers(authorization="Bearer nope")))
            status, headers, _ = immediate_of((await call.receive())[0])
            assert (status, headers["www-authenticate"]) == (401, "Bearer")
            call = open_call(channel)
            await call.send(
                headers_message(request_headers(authorization="Bearer sk-1")),
                body_message(completion(pods.model)),
            )
            _, routed = await call.receive(2)
            assert list(routed.request_body.response.header_mutation.remove_headers) == ["authorization"]
            call.call.cancel()
    finally:
        await picker.stop()


async def test_the_models_list_needs_an_api_key_too(pods: SimCluster):
    # GET /v1/models was routed without checking the key (the gateway checks it).
    picker = await start_picker(list(pods.addresses), gateway={"api_keys": ["sk-1"]})
    assert picker.bound is not None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            call = open_call(channel)
            await call.send(headers_message(request_headers("/v1/models", "GET")))
            status, headers, _ = immediate_of((await call.receive())[0])
            assert (status, headers["www-authenticate"]) == (401, "Bearer")
            call = open_call(channel)
            keyed = request_headers("/v1/models", "GET", authorization="Bearer sk-1")
            await call.send(headers_message(keyed))
            (routed,) = await call.receive()
            assert destination_list(routed)[0] in pods.addresses
            assert list(routed.request_headers.response.header_mutation.remove_headers) == ["authorization"]
            call.call.cancel()
    finally:
        await picker.stop()


async def test_a_request_served_by_a_fallback_moves_its_load_and_reports_it(pods: SimCluster):
    picker = await start_picker(list(pods.addresses), scheduler=THREE_TARGETS)
    try:
        assert picker.bound is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            call = open_call(channel)
            await call.send(headers_message(request_headers()), body_message(completion(pods.model)))
            _, routed = await call.receive(2)
            picked, fallback, _ = destination_list(routed)
            inflight = picker.core.pool.columns["inflight_requests"]
            assert inflight[picker.core.pool.position(picked)] == 1
            # Envoy retried on the pick's first fallback, and says so in the response headers.
            await call.send(response_headers_message(content_type="text/event-stream", served=fallback))
            (answered,) = await call.receive()
            mutation = answered.response_headers.response.header_mutation
            assert set_headers(mutation)["x-slorouter-endpoint"] == fallback
            assert list(mutation.remove_headers) == ["x-gateway-destination-endpoint-served"]
            assert inflight[picker.core.pool.position(picked)] == 0
            assert inflight[picker.core.pool.position(fallback)] == 1
            await call.send(
                response_body_message(b'data: {"choices": [{"text": "hi"}]}\n\ndata: [DONE]\n\n', True)
            )
            await call.receive()
            assert inflight[picker.core.pool.position(fallback)] == 0
            await call.end()
        assert _idle(picker)
        assert _metric(picker, "slorouter_upstream_retries_total ") == 1.0
        assert (
            _metric(picker, f'slorouter_upstream_failures_total{{endpoint="{picked}",phase="connect"}}') == 1
        )
        assert _metric(picker, f'slorouter_requests_total{{code="200",endpoint="{fallback}"}}') == 1.0
    finally:
        await picker.stop()


async def test_a_served_header_naming_the_pick_or_no_endpoint_changes_nothing(
    pods: SimCluster, picker, channel
):
    for served in ("", "10.9.9.9:8000"):
        call = open_call(channel)
        await call.send(headers_message(request_headers()), body_message(completion(pods.model)))
        _, routed = await call.receive(2)
        (picked,) = destination_list(routed)
        await call.send(response_headers_message(served=served or picked))
        (answered,) = await call.receive()
        assert (
            set_headers(answered.response_headers.response.header_mutation)["x-slorouter-endpoint"] == picked
        )
        await call.send(response_body_message(b"{}", True))
        await call.receive()
        await call.end()
    assert _metric(picker, "slorouter_upstream_retries_total ") == 0.0


@pytest.mark.parametrize(
    ("status", "flags", "phase"),
    [(503, "UF,URX", "connect"), (504, "UT", "timeout"), (200, "-", None), (503, "-", None)],
)
async def test_envoys_response_flags_count_upstream_failures(
    pods: SimCluster, picker, channel, status: int, flags: str, phase: str | None
):
    call = open_call(channel)
    await call.send(headers_message(request_headers()), body_message(completion(pods.model, n=2)))
    _, routed = await call.receive(2)
    (picked,) = destination_list(routed)
    await call.send(response_headers_message(status, flags=flags))
    (answered,) = await call.receive()
    assert list(answered.response_headers.response.header_mutation.remove_headers) == [
        "x-slorouter-response-flags"
    ]
    await call.end()
    counted = _metric(picker, f'slorouter_upstream_failures_total{{endpoint="{picked}",phase="{phase}"}}')
    assert counted == (1.0 if phase else 0.0)
    assert _idle(picker)


# --- the observed response path: a picking stream that skips the response, an observer that reads it ------


SSE = "text/event-stream"


def _observed_call(channel: grpc.aio.Channel, role: str) -> Call:
    stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
    return Call(stub.Process(metadata=((messages.RESPONSE_PATH.decode(), role),)))


def _observed_metadata(routed: Any) -> dict[str, str]:
    fields = routed.dynamic_metadata.fields[messages.OBSERVED_NAMESPACE].struct_value.fields
    return {key: value.string_value for key, value in fields.items()}


def _observing(message: Any, key: str | None) -> Any:
    """``message`` as the observing filter sends it: observability mode, the pick's key forwarded."""
    message.observability_mode = True
    if key is not None:
        namespace = message.metadata_context.filter_metadata[messages.OBSERVED_NAMESPACE]
        namespace.fields[messages.REQUEST_KEY].string_value = key
    return message


def _with_attributes(message: Any, served: str | None = None, flag_bits: int = 0) -> Any:
    fields = message.attributes["envoy.filters.http.ext_proc"].fields
    if served is not None:
        fields[messages.UPSTREAM_ADDRESS].string_value = served
    fields[messages.RESPONSE_FLAG_BITS].number_value = flag_bits
    return message


async def _pick_observed(call: Call, model: str) -> tuple[str, dict[str, str]]:
    await call.send(
        headers_message(request_headers(), request_mode=DUPLEX, response_mode=NONE),
        body_message(completion(model)),
    )
    routed, _ = await call.receive(2)
    assert not routed.HasField("mode_override")  # the response is not asked for on this stream
    (picked,) = destination_list(routed)
    return picked, _observed_metadata(routed)


async def test_an_observed_request_is_answered_once_and_its_response_fed_by_the_observer(
    pods: SimCluster, picker, channel
):
    picking = _observed_call(channel, "observed")
    picked, observed = await _pick_observed(picking, pods.model)
    assert observed["x-slorouter-route"] == "heuristic"  # for the route's response headers
    await picking.end()  # the data plane has nothing more to send on it: the request stays in flight
    await asyncio.sleep(0.05)
    assert not _idle(picker)
    observer = _observed_call(channel, "observer")
    await observer.send(
        _observing(headers_message(request_headers()), observed[messages.REQUEST_KEY]),
        _observing(_with_attributes(response_headers_message(content_type=SSE), picked), None),
        _observing(response_body_message(b'data: {"choices": [{"text": "hi"}]}\n\n', False), None),
    )
    await asyncio.sleep(0.05)
    assert not _idle(picker)
    await observer.send(_observing(response_body_message(b"data: [DONE]\n\n", True), None))
    await eventually(lambda: _idle(picker))  # applied once the picks read with it are answered
    await observer.end()
    assert await observer.call.read() == grpc.aio.EOF  # nothing was answered
    assert await observer.call.code() == grpc.StatusCode.OK
    assert _metric(picker, "inference_objective_request_ttft_seconds_count{") == 1.0
    assert _metric(picker, f'slorouter_requests_total{{code="200",endpoint="{picked}"}}') == 1.0
    assert _metric(picker, "slorouter_client_disconnects_total") == 0.0


async def test_the_observer_reports_a_retry_and_envoys_flags_from_its_attributes(pods: SimCluster):
    picker = await start_picker(list(pods.addresses), scheduler=THREE_TARGETS)
    try:
        assert picker.bound is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            picking = _observed_call(channel, "observed")
            await picking.send(
                headers_message(request_headers(), request_mode=DUPLEX, response_mode=NONE),
                body_message(completion(pods.model, n=2)),  # nothing reads the body: done at the headers
            )
            routed, _ = await picking.receive(2)
            picked, fallback, _ = destination_list(routed)
            observer = _observed_call(channel, "observer")
            uf_urx = 1 << 5 | 1 << 15  # UpstreamConnectionFailure, UpstreamRetryLimitExceeded
            await observer.send(
                _observing(headers_message(request_headers()), _observed_metadata(routed)["request"]),
                _observing(_with_attributes(response_headers_message(503), fallback, uf_urx), None),
            )
            await eventually(lambda: _idle(picker))
            await observer.end()
            assert await observer.call.read() == grpc.aio.EOF
            await picking.end()
        assert _metric(picker, "slorouter_upstream_retries_total ") == 1.0
        connect = 'slorouter_upstream_failures_total{endpoint="%s",phase="connect"}'
        assert _metric(picker, connect % picked) == 1.0  # the retry
        assert _metric(picker, connect % fallback) == 1.0  # Envoy's own 503 on the fallback
        assert _metric(picker, f'slorouter_requests_total{{code="503",endpoint="{fallback}"}}') == 1.0
    finally:
        await picker.stop()


async def test_an_observer_ending_before_the_response_releases_the_request(pods: SimCluster, picker, channel):
    picking = _observed_call(channel, "observed")
    _, observed = await _pick_observed(picking, pods.model)
    observer = _observed_call(channel, "observer")
    await observer.send(_observing(headers_message(request_headers()), observed[messages.REQUEST_KEY]))
    await picking.end()
    await asyncio.sleep(0.05)
    assert not _idle(picker)  # claimed: the observer's stream tells when the request ends
    observer.call.cancel()  # the client left before the response: the data plane closes the stream
    await eventually(lambda: _idle(picker))
    assert _metric(picker, "slorouter_client_disconnects_total") == 1.0
    assert _metric(picker, "inference_objective_request_ttft_seconds_count{") == 0.0


async def test_a_request_no_observer_claims_is_released_and_counted(
    pods: SimCluster, picker, channel, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(stream_module, "OBSERVER_CLAIM_S", 0.05)
    picking = _observed_call(channel, "observed")
    _, observed = await _pick_observed(picking, pods.model)
    await picking.end()
    await eventually(lambda: _idle(picker))
    assert _metric(picker, "slorouter_extproc_unobserved_requests_total") == 1.0
    # An observer that comes too late (or to another picker process) finds nothing, and is let go.
    observer = _observed_call(channel, "observer")
    await observer.send(_observing(headers_message(request_headers()), observed[messages.REQUEST_KEY]))
    assert await observer.call.read() == grpc.aio.EOF
    assert _metric(picker, "slorouter_extproc_unmatched_observations_total") == 1.0
    # A response the picker did not route (no key: a local reply) is let go without a count.
    observer = _observed_call(channel, "observer")
    await observer.send(_observing(response_headers_message(404), None))
    assert await observer.call.read() == grpc.aio.EOF
    assert _metric(picker, "slorouter_extproc_unmatched_observations_total") == 1.0
