"""OpenTelemetry tracing through the gateway: the span tree of a request on simulated pods, the pick's
attributes, the W3C trace context continued from the client and sent to the model server, and nothing at all
when tracing is off. Spans go to the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from slorouter.config import parse_config
from slorouter.gateway.runtime import Router
from tests.gateway.conftest import FakeUpstream

TRACING = {"enabled": True, "sampling": {"samplerArg": 1.0}, "serviceName": "router-under-test"}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


async def start_traced_router(
    endpoints: list[str], exporter: InMemorySpanExporter, tracing: dict[str, Any] | None = None, **extra: Any
) -> Router:
    data: dict[str, Any] = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "pool": {"endpoints": endpoints, "scrape_interval_ms": 20},
        "seed": 7,
        "tracing": TRACING if tracing is None else tracing,
        **extra,
    }
    router = Router.build(parse_config(data), span_exporter=exporter)
    await router.start()
    return router


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


@pytest.fixture
async def recording_upstream() -> AsyncIterator[FakeUpstream]:
    """Answers a completion and keeps the headers of every inference request it got."""
    seen: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.append({name.lower(): value for name, value in request.headers.items()})
        return web.json_response({"choices": [{"text": "hi"}], "usage": {"completion_tokens": 2}})

    upstream = await FakeUpstream(answer).start()
    upstream.seen = seen  # type: ignore[attr-defined]
    try:
        yield upstream
    finally:
        await upstream.close()


async def test_a_request_is_one_span_with_scheduling_and_upstream_children(cluster, http):
    exporter = InMemorySpanExporter()
    router = await start_traced_router(list(cluster.addresses), exporter)
    try:
        body = {"model": cluster.model, "prompt": "Hello there", "max_tokens": 3, "stream": True}
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
            endpoint = resp.headers["x-slorouter-endpoint"]
    finally:
        await router.stop()
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"slorouter.request", "slorouter.schedule", "slorouter.upstream"}
    root, schedule, upstream = (
        spans["slorouter.request"],
        spans["slorouter.schedule"],
        spans["slorouter.upstream"],
    )
    assert root.kind is SpanKind.SERVER and root.parent is None
    assert schedule.kind is SpanKind.INTERNAL and upstream.kind is SpanKind.CLIENT
    for child in (schedule, upstream):
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
    assert schedule.end_time <= upstream.start_time  # picked, then sent
    assert root.resource.attributes["service.name"] == "router-under-test"
    attributes = dict(root.attributes or {})
    assert attributes["slorouter.front_end"] == "gateway"
    assert attributes["url.path"] == "/v1/completions"
    assert attributes["gen_ai.request.model"] == cluster.model
    assert attributes["slorouter.endpoint"] == endpoint
    assert attributes["slorouter.route"] == "heuristic"
    assert attributes["slorouter.streaming"] is True
    assert attributes["http.response.status_code"] == 200
    assert "slorouter.predicted_ttft_ms" not in attributes  # no predictor
    assert dict(schedule.attributes or {})["slorouter.endpoint"] == endpoint
    upstream_attributes = dict(upstream.attributes or {})
    assert f"{upstream_attributes['server.address']}:{upstream_attributes['server.port']}" == endpoint
    assert upstream_attributes["http.response.status_code"] == 200
    assert upstream_attributes["slorouter.output_tokens"] == 3
    assert all(span.status.status_code is not StatusCode.ERROR for span in spans.values())


async def test_the_fallback_of_a_warming_predictor_is_on_the_scheduling_span(cluster, http):
    exporter = InMemorySpanExporter()
    predictor = {"mode": "embedded", "prediction_by_default": True, "embedded": {"persist": False}}
    router = await start_traced_router(list(cluster.addresses), exporter, predictor=predictor)
    try:
        body = {"model": cluster.model, "prompt": "Hello there", "max_tokens": 2}
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["x-slorouter-route"] == "fallback"
    finally:
        await router.stop()
    schedule = dict(by_name(exporter.get_finished_spans())["slorouter.schedule"].attributes or {})
    assert schedule["slorouter.route"] == "fallback"
    assert schedule["slorouter.fallback_reason"] == "warming-up"


async def test_the_clients_trace_is_continued_and_sent_to_the_model_server(recording_upstream, http):
    exporter = InMemorySpanExporter()
    # A parent's sampled flag decides, whatever the ratio.
    tracing = {"enabled": True, "sampling": {"samplerArg": "0"}}
    router = await start_traced_router([recording_upstream.address], exporter, tracing)
    try:
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "vendor=1"}
        body = {"model": "fake", "prompt": "Hi", "max_tokens": 2}
        async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
    finally:
        await router.stop()
    spans = by_name(exporter.get_finished_spans())
    root, upstream = spans["slorouter.request"], spans["slorouter.upstream"]
    assert format(root.context.trace_id, "032x") == CLIENT_TRACE
    assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_SPAN
    (sent,) = recording_upstream.seen
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id) == ("00", CLIENT_TRACE) and int(flags, 16) & 1
    assert span_id == format(upstream.context.span_id, "016x")  # the model server's parent: the upstream span
    assert sent["tracestate"] == "vendor=1"


async def test_a_new_trace_reaches_the_model_server_too(recording_upstream, http):
    exporter = InMemorySpanExporter()
    router = await start_traced_router([recording_upstream.address], exporter)
    try:
        body = {"model": "fake", "prompt": "Hi", "max_tokens": 2}
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 200
    finally:
        await router.stop()
    upstream = by_name(exporter.get_finished_spans())["slorouter.upstream"]
    (sent,) = recording_upstream.seen
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, span_id) == (
        "00",
        f"{upstream.context.trace_id:032x}",
        f"{upstream.context.span_id:016x}",
    )
    assert int(flags, 16) & 1  # sampled


async def test_an_unsampled_request_makes_no_span_and_passes_its_context_on(recording_upstream, http):
    exporter = InMemorySpanExporter()
    router = await start_traced_router([recording_upstream.address], exporter)  # samplerArg 1.0
    try:
        body = {"model": "fake", "prompt": "Hi", "max_tokens": 2}
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"}  # the caller did not sample it
        async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
    finally:
        await router.stop()
    assert exporter.get_finished_spans() == ()
    (sent,) = recording_upstream.seen
    version, trace_id, _span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id) == ("00", CLIENT_TRACE) and not int(flags, 16) & 1


async def test_a_failed_upstream_and_the_retry_that_finds_no_other_endpoint_are_marked(http):
    async def hangs_up(request: web.Request) -> web.StreamResponse:
        request.transport.abort()  # type: ignore[union-attr]
        raise asyncio.CancelledError

    bad = await FakeUpstream(hangs_up).start()
    exporter = InMemorySpanExporter()
    router = await start_traced_router([bad.address], exporter)
    try:
        body = {"model": "fake", "prompt": "question", "max_tokens": 2}
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 502
    finally:
        await router.stop()
        await bad.close()
    spans = exporter.get_finished_spans()
    (root,) = [span for span in spans if span.name == "slorouter.request"]
    children = sorted((s for s in spans if s is not root), key=lambda span: span.start_time or 0)
    assert [span.name for span in children] == [
        "slorouter.schedule",
        "slorouter.upstream",
        "slorouter.schedule",
    ]
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in children)
    first, failed, retry = children
    assert first.status.status_code is not StatusCode.ERROR
    assert failed.status.status_code is StatusCode.ERROR
    assert dict(failed.attributes or {})["slorouter.failure_phase"] == "connect"
    assert dict(retry.attributes or {})["slorouter.attempt"] == 2
    assert retry.status.status_code is StatusCode.ERROR  # no endpoint left to try
    assert root.status.status_code is StatusCode.ERROR
    assert dict(root.attributes or {})["http.response.status_code"] == 502


async def test_tracing_off_makes_no_span_and_adds_no_header(recording_upstream, http):
    exporter = InMemorySpanExporter()
    router = await start_traced_router([recording_upstream.address], exporter, tracing={})
    try:
        assert router.core.tracing is None
        body = {"model": "fake", "prompt": "Hi", "max_tokens": 2}
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 200
    finally:
        await router.stop()
    assert exporter.get_finished_spans() == ()
    (sent,) = recording_upstream.seen
    assert "traceparent" not in sent and "tracestate" not in sent
