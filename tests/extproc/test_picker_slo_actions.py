"""The picker's messages for a request's plan (deadlines and hedges), driven through a real grpc.aio channel:
Envoy's router headers in the pick's header mutation, the SLO for Envoy's local reply, the response headers
held until a stream's first token, the immediate response the picker sends on its own at a deadline, the
error event that ends a stream over its TPOT, and a hedge's outcome read from the response."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

from slorouter.extproc import messages
from slorouter.extproc.runtime import EndpointPicker
from slorouter.sim.server import SimCluster
from tests.extproc.conftest import (
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
    start_picker,
)
from tests.gateway.conftest import eventually

OBJECTIVES = {
    "interactive": {"priority": 1, "deadline": {"action": "hedge"}},
    "batch": {"priority": -1, "deadline": {"action": "cancel", "tpot": True, "tpot_min_tokens": 3}},
}
HEDGING = {"max_slo_share": 0.5, "min_delay_ms": 0, "max_share": 1.0, "burst": 10}
SSE = "text/event-stream"
TOKEN = b'data: {"choices": [{"text": "x"}]}\n\n'
ENVOY_HEADERS = (messages.PER_TRY_TIMEOUT, messages.HEDGE_ON_PER_TRY_TIMEOUT, messages.MAX_RETRIES)


@pytest.fixture
async def picker(pods: SimCluster) -> AsyncIterator[EndpointPicker]:
    # Three endpoints per pick: Envoy sends a hedged copy to the first fallback.
    running = await start_picker(
        list(pods.addresses), objectives=OBJECTIVES, hedging=HEDGING, scheduler=THREE_TARGETS
    )
    try:
        yield running
    finally:
        await running.stop()


def _slo(objective: str, ttft_ms: float, **more: str) -> dict[str, str]:
    return request_headers(
        **{"x-gateway-inference-objective": objective, "x-slo-ttft-ms": str(ttft_ms), **more}
    )


async def _routed(call: Call, model: str, headers: dict[str, str], response_mode: int = STREAMED) -> Any:
    """The pick's answer to a full-duplex request (its headers), the body streamed back after it."""
    await call.send(
        headers_message(headers, request_mode=DUPLEX, response_mode=response_mode),
        body_message(completion(model)),
    )
    routed, _ = await call.receive(2)
    assert routed.WhichOneof("response") == "request_headers", routed
    return routed


def _role_call(channel: grpc.aio.Channel, role: str) -> Call:
    """A stream of the observed response path: the picking filter's (``observed``) or the observer's."""
    stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
    return Call(stub.Process(metadata=((messages.RESPONSE_PATH.decode(), role),)))


def _mutation(routed: Any) -> dict[str, str]:
    return set_headers(routed.request_headers.response.header_mutation)


def _metric(picker: EndpointPicker, prefix: str) -> float:
    lines = picker.core.metrics.render().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


def _idle(picker: EndpointPicker) -> bool:
    return int(picker.core.pool.columns["inflight_requests"].sum()) == 0


async def test_a_hedge_plan_asks_envoy_for_a_per_try_timeout_hedging_on_it_and_one_retry(
    pods: SimCluster, picker, channel
):
    call = open_call(channel)
    mutation = _mutation(await _routed(call, pods.model, _slo("interactive", 400)))
    assert 1 <= int(mutation[messages.PER_TRY_TIMEOUT]) <= 200  # half the SLO after the request came
    assert mutation[messages.HEDGE_ON_PER_TRY_TIMEOUT] == "true"
    assert mutation[messages.MAX_RETRIES] == "1"  # the copy, never a second one
    actions = picker.core.actions
    assert actions is not None and actions.budget.level == pytest.approx(9.0)  # taken at the pick
    other = open_call(channel)  # no SLO, no plan
    assert not set(ENVOY_HEADERS) & set(_mutation(await _routed(other, pods.model, request_headers())))


async def test_no_hedge_is_armed_for_a_pick_without_fallbacks(pods: SimCluster):
    # One endpoint per pick (the default picker): Envoy would send the copy to the pick again.
    picker = await start_picker(list(pods.addresses), objectives=OBJECTIVES, hedging=HEDGING)
    try:
        assert picker.bound is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            routed = await _routed(open_call(channel), pods.model, _slo("interactive", 400))
        assert not set(ENVOY_HEADERS) & set(_mutation(routed))
        assert (
            _metric(picker, 'slorouter_hedges_skipped_total{objective="interactive",reason="no-endpoint"}')
            == 1
        )
    finally:
        await picker.stop()


async def test_in_band_the_response_says_whether_the_copy_went_and_which_one_won(
    pods: SimCluster, picker, channel
):
    call = open_call(channel)
    routed = await _routed(call, pods.model, _slo("interactive", 20))
    _, copy, _ = destination_list(routed)  # Envoy's copy goes to the first fallback
    await asyncio.sleep(0.05)  # past the hedge delay (10 ms)
    answer = response_headers_message(served=copy)
    answer.response_headers.headers.headers.add(key=messages.ATTEMPTS, raw_value=b"2")
    await call.send(answer)
    (headers,) = await call.receive()
    mutation = headers.response_headers.response.header_mutation
    assert set_headers(mutation)["x-slorouter-endpoint"] == copy  # the load and the samples followed it
    assert messages.ATTEMPTS in mutation.remove_headers
    await call.send(response_body_message(b'{"choices": [{"text": "hi"}]}', True))
    await call.receive()
    await call.end()
    assert _metric(picker, 'slorouter_hedges_total{objective="interactive",outcome="won"}') == 1
    assert _metric(picker, "slorouter_upstream_retries_total") == 0  # a hedge, not a retry
    await eventually(lambda: _idle(picker))


async def test_on_the_observed_path_the_deadline_is_envoys_per_try_timeout_and_its_504_is_counted(
    pods: SimCluster, picker, channel
):
    picking = _role_call(channel, "observed")
    routed = await _routed(picking, pods.model, _slo("batch", 150), response_mode=NONE)
    mutation = _mutation(routed)
    assert 1 <= int(mutation[messages.PER_TRY_TIMEOUT]) <= 150
    assert mutation[messages.HEDGE_ON_PER_TRY_TIMEOUT] == "false"  # a timeout, not a hedge
    fields = routed.dynamic_metadata.fields[messages.OBSERVED_NAMESPACE].struct_value.fields
    assert (
        fields[messages.DEADLINE_KEY].string_value == "the request's TTFT SLO of 150 ms (objective 'batch')"
    )
    observer = _role_call(channel, "observer")
    claim = headers_message(request_headers())
    claim.metadata_context.filter_metadata[messages.OBSERVED_NAMESPACE].fields[
        messages.REQUEST_KEY
    ].string_value = fields[messages.REQUEST_KEY].string_value
    timed_out = response_headers_message(504, "application/json")
    timed_out.attributes["envoy.filters.http.ext_proc"].fields[messages.RESPONSE_FLAG_BITS].number_value = (
        1 << 2
    )
    await observer.send(claim, timed_out)
    await eventually(lambda: _idle(picker))
    assert _metric(picker, 'slorouter_deadline_cancellations_total{objective="batch",slo="ttft"}') == 1
    assert _metric(picker, 'slorouter_requests_total{code="504"') == 1
    assert _metric(picker, "slorouter_upstream_failures_total") == 0  # the router's deadline, not a failure


async def test_in_band_the_picker_answers_504_on_its_own_when_the_deadline_passes_before_the_response(
    pods: SimCluster, picker, channel
):
    call = open_call(channel)
    routed = await _routed(call, pods.model, _slo("batch", 50))
    assert not set(ENVOY_HEADERS) & set(_mutation(routed))  # in-band, the picker keeps the deadline itself
    (answer,) = await call.receive()  # sent on its own, at the deadline
    status, headers, body = immediate_of(answer)
    assert (status, headers["content-type"]) == (504, "application/json")
    assert body["error"]["code"] == "deadline_exceeded"
    assert "TTFT SLO of 50 ms (objective 'batch')" in body["error"]["message"]
    assert await call.call.code() == grpc.StatusCode.OK  # nothing more is expected on the stream
    assert _idle(picker)
    assert _metric(picker, 'slorouter_deadline_cancellations_total{objective="batch",slo="ttft"}') == 1


async def test_in_band_full_duplex_holds_a_streams_headers_until_its_first_token(
    pods: SimCluster, picker, channel
):
    # No token by the deadline: the held headers are never answered; the 504 replaces the response.
    call = open_call(channel)
    await _routed(call, pods.model, _slo("batch", 50), response_mode=DUPLEX)
    await call.send(response_headers_message(content_type=SSE))
    (answer,) = await call.receive()
    assert immediate_of(answer)[0] == 504
    # A first token in time: the headers are answered with it, the chunks before it after them, in order.
    call = open_call(channel)
    await _routed(call, pods.model, _slo("batch", 10_000), response_mode=DUPLEX)
    await call.send(
        response_headers_message(content_type=SSE),
        response_body_message(b": ping\n\n", False),
        response_body_message(TOKEN, False),
    )
    released = await call.receive(3)
    assert [r.WhichOneof("response") for r in released] == [
        "response_headers",
        "response_body",
        "response_body",
    ]
    passed = [r.response_body.response.body_mutation.streamed_response.body for r in released[1:]]
    assert passed == [b": ping\n\n", TOKEN]
    await call.send(response_body_message(b"data: [DONE]\n\n", True))
    await call.receive()
    await call.end()
    await eventually(lambda: _idle(picker))
    assert _metric(picker, 'slorouter_deadline_cancellations_total{objective="batch",slo="ttft"}') == 1


async def test_in_band_streamed_response_headers_are_answered_at_once_and_end_the_deadline(
    pods: SimCluster, picker, channel
):
    call = open_call(channel)
    await _routed(call, pods.model, _slo("batch", 100), response_mode=STREAMED)
    await call.send(response_headers_message(content_type=SSE))
    (headers,) = await call.receive()  # Envoy sends no body before this answer: nothing to wait for
    assert headers.WhichOneof("response") == "response_headers"
    await asyncio.sleep(0.2)  # past the deadline: the response began, so nothing is sent
    await call.send(response_body_message(TOKEN, False), response_body_message(b"data: [DONE]\n\n", True))
    answers = await call.receive(2)
    assert [a.WhichOneof("response") for a in answers] == ["response_body", "response_body"]
    await call.end()
    await eventually(lambda: _idle(picker))
    assert _metric(picker, "slorouter_deadline_cancellations_total") == 0


async def test_in_band_full_duplex_ends_a_stream_over_its_tpot_with_an_error_event(
    pods: SimCluster, picker, channel
):
    call = open_call(channel)
    headers = _slo("batch", 10_000, **{"x-slo-tpot-ms": "0.001"})
    await _routed(call, pods.model, headers, response_mode=DUPLEX)
    await call.send(response_headers_message(content_type=SSE), response_body_message(TOKEN, False))
    await call.receive(2)
    for _ in range(2):
        await asyncio.sleep(0.01)
        await call.send(response_body_message(TOKEN, False))
    first, last = await call.receive(2)
    assert not first.response_body.response.body_mutation.streamed_response.end_of_stream
    cut = last.response_body.response.body_mutation.streamed_response
    assert cut.end_of_stream  # Envoy ends the client's stream here and resets the upstream one
    token, error, done = [e for e in cut.body.split(b"\n\n") if e]
    assert token == TOKEN.strip() and done == b"data: [DONE]"
    assert json.loads(error.removeprefix(b"data: "))["error"]["code"] == "deadline_exceeded"
    assert await call.call.code() == grpc.StatusCode.OK
    assert _idle(picker)
    assert _metric(picker, 'slorouter_deadline_cancellations_total{objective="batch",slo="tpot"}') == 1


async def test_a_deadline_that_passed_before_the_pick_is_answered_at_once(pods: SimCluster, picker, channel):
    call = open_call(channel)
    await call.send(
        headers_message(_slo("batch", 0.001), request_mode=DUPLEX), body_message(completion(pods.model))
    )
    (answer,) = await call.receive()
    status, _, body = immediate_of(answer)
    assert status == 504 and body["error"]["code"] == "deadline_exceeded"
    assert _idle(picker)
