"""OpenTelemetry tracing through the ext_proc picker, driven over a real grpc.aio channel as Envoy would: the
span tree of a routed request, the trace context continued from the client and set on the request to the
model server (a header mutation), a rejected request, and nothing when tracing is off."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from slorouter.config import parse_config
from slorouter.extproc.runtime import EndpointPicker, PickerPorts
from slorouter.sim.server import SimCluster
from tests.extproc.conftest import (
    body_message,
    completion,
    headers_message,
    immediate_of,
    open_call,
    request_headers,
    response_body_message,
    response_headers_message,
    set_headers,
)
from tests.gateway.conftest import eventually

TRACING = {"enabled": True, "sampling": {"samplerArg": 1.0}}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


async def start_traced_picker(
    endpoints: list[str], exporter: InMemorySpanExporter, tracing: dict[str, Any]
) -> EndpointPicker:
    data = {"pool": {"endpoints": endpoints, "scrape_interval_ms": 20}, "seed": 7, "tracing": tracing}
    picker = EndpointPicker.build(
        parse_config(data), PickerPorts("127.0.0.1", 0, 0, 0), span_exporter=exporter
    )
    await picker.start()
    return picker


async def _channel(picker: EndpointPicker) -> grpc.aio.Channel:
    assert picker.bound is not None
    return grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}")


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def traced(pods: SimCluster, exporter: InMemorySpanExporter) -> AsyncIterator[EndpointPicker]:
    picker = await start_traced_picker(list(pods.addresses), exporter, TRACING)
    try:
        yield picker
    finally:
        await picker.stop()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


async def _route(call: Any, model: str, **headers: str) -> dict[str, str]:
    """Send a buffered request; the header mutation of the pick."""
    await call.send(headers_message(request_headers(**headers)))
    await call.receive()
    await call.send(body_message(completion(model)))
    (routed,) = await call.receive()
    return set_headers(routed.request_body.response.header_mutation)


async def test_a_routed_request_is_one_span_with_scheduling_and_upstream_children(pods, traced, exporter):
    async with await _channel(traced) as channel:
        call = open_call(channel)
        mutation = await _route(call, pods.model, traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
        target = mutation["x-gateway-destination-endpoint"]
        # Picked: only the scheduling span has ended; the request and its upstream span are still open.
        assert [span.name for span in exporter.get_finished_spans()] == ["slorouter.schedule"]
        await call.send(response_headers_message(content_type="text/event-stream"))
        await call.receive()
        reply = (
            b'data: {"choices": [{"text": "hi"}]}\n\ndata: {"choices": [{"text": "!"}]}\n\ndata: [DONE]\n\n'
        )
        await call.send(response_body_message(reply, True))
        await call.receive()
        await call.end()
    await eventually(lambda: len(exporter.get_finished_spans()) == 3)
    spans = by_name(exporter.get_finished_spans())
    root, schedule, upstream = (
        spans["slorouter.request"],
        spans["slorouter.schedule"],
        spans["slorouter.upstream"],
    )
    # The client's trace is continued...
    assert format(root.context.trace_id, "032x") == CLIENT_TRACE
    assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_SPAN
    assert root.kind is SpanKind.SERVER and upstream.kind is SpanKind.CLIENT
    for child in (schedule, upstream):
        assert child.parent is not None and child.parent.span_id == root.context.span_id
    # ... and the model server's request carries the upstream span's context (Envoy sets the header).
    version, trace_id, span_id, flags = mutation["traceparent"].split("-")
    assert (version, trace_id) == ("00", CLIENT_TRACE) and int(flags, 16) & 1
    assert span_id == format(upstream.context.span_id, "016x")
    attributes = dict(root.attributes or {})
    assert attributes["slorouter.front_end"] == "extproc"
    assert attributes["slorouter.endpoint"] == target
    assert attributes["slorouter.route"] == "heuristic"
    assert attributes["gen_ai.request.model"] == pods.model
    assert attributes["http.response.status_code"] == 200
    assert dict(schedule.attributes or {})["slorouter.endpoint"] == target
    assert dict(upstream.attributes or {})["slorouter.output_tokens"] == 2
    assert dict(upstream.attributes or {})["slorouter.ttft_ms"] >= 0
    assert all(span.status.status_code is not StatusCode.ERROR for span in spans.values())


async def test_a_new_trace_is_set_on_the_request_to_the_model_server(pods, traced, exporter):
    async with await _channel(traced) as channel:
        call = open_call(channel)
        mutation = await _route(call, pods.model)
        await call.end()  # the stream ends before the response: the request is abandoned
    await eventually(lambda: len(exporter.get_finished_spans()) == 3)
    spans = by_name(exporter.get_finished_spans())
    upstream = spans["slorouter.upstream"]
    _, trace_id, span_id, _ = mutation["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{upstream.context.trace_id:032x}", f"{upstream.context.span_id:016x}")
    assert spans["slorouter.request"].parent is None
    assert upstream.status.status_code is StatusCode.ERROR  # no response came
    assert spans["slorouter.request"].status.status_code is StatusCode.ERROR


async def test_a_rejected_request_ends_its_span_with_the_status(pods, traced, exporter):
    async with await _channel(traced) as channel:
        call = open_call(channel)
        await call.send(headers_message(request_headers()))
        await call.receive()
        await call.send(body_message(b"{not json"))
        (rejected,) = await call.receive()
        assert immediate_of(rejected)[0] == 400
        await call.end()
    await eventually(lambda: len(exporter.get_finished_spans()) == 1)
    (root,) = exporter.get_finished_spans()
    assert root.name == "slorouter.request"
    assert dict(root.attributes or {})["http.response.status_code"] == 400


async def test_tracing_off_makes_no_span_and_sets_no_header(pods, exporter):
    picker = await start_traced_picker(list(pods.addresses), exporter, {"enabled": False})
    try:
        assert picker.core.tracing is None
        async with await _channel(picker) as channel:
            call = open_call(channel)
            mutation = await _route(call, pods.model)
            await call.end()
    finally:
        await picker.stop()
    assert "traceparent" not in mutation and "tracestate" not in mutation
    assert exporter.get_finished_spans() == ()
