"""Tracing over the wire: the gateway's real OTLP/gRPC exporter sends its spans to an OTLP receiver (the
collector's TraceService, tests/helpers/otlp_receiver.py), the client's W3C trace continued, flushed at
shutdown."""

from __future__ import annotations

from slorouter.config import parse_config
from slorouter.gateway.runtime import Router
from tests.helpers.otlp_receiver import OtlpReceiver

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_spans_reach_an_otlp_receiver_over_grpc(cluster, http):
    with OtlpReceiver() as receiver:
        config = parse_config(
            {
                "gateway": {"host": "127.0.0.1", "port": 0},
                "pool": {"endpoints": list(cluster.addresses), "scrape_interval_ms": 20},
                "tracing": {
                    "enabled": True,
                    "otelExporterEndpoint": receiver.endpoint,
                    "sampling": {"samplerArg": "1.0"},
                    "serviceName": "otlp-under-test",
                },
            }
        )
        router = Router.build(config)
        await router.start()
        try:
            for i in range(3):
                body = {"model": cluster.model, "prompt": f"Hello {i}", "max_tokens": 4, "stream": True}
                headers = {"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b{i}-01"}
                async with http.post(
                    f"http://{router.address}/v1/completions", json=body, headers=headers
                ) as resp:
                    assert resp.status == 200
                    await resp.read()
        finally:
            await router.stop()  # shuts the tracer provider down: the batch is exported before it returns
        spans = receiver.spans()
    names = sorted(span.name for span in spans)
    assert names == sorted(["slorouter.request", "slorouter.schedule", "slorouter.upstream"] * 3)
    assert {span.service_name for span in spans} == {"otlp-under-test"}
    assert {span.trace_id for span in spans} == {CLIENT_TRACE}
    roots = [span for span in spans if span.name == "slorouter.request"]
    assert sorted(span.parent_span_id for span in roots) == [f"00f067aa0ba902b{i}" for i in range(3)]
    children = [span for span in spans if span.name != "slorouter.request"]
    assert {span.parent_span_id for span in children} <= {span.span_id for span in roots}
    upstream = [span for span in spans if span.name == "slorouter.upstream"]
    hosts = {address.rsplit(":", 1)[0] for address in cluster.addresses}
    assert {span.attributes["server.address"] for span in upstream} <= hosts
