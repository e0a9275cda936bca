"""The audit section through the gateway, on simulated pods: the scores header (bounded), routing regret on
/metrics and the status page, the span's attributes; and none of it when the section is off."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from slorouter.config import parse_config
from slorouter.gateway.runtime import Router
from slorouter.serving.status import STATUS_PATH, decode_status
from slorouter.sim.server import SimCluster
from tests.gateway.conftest import start_router

PROMPT = "The same long system prompt for every turn. " * 40  # ~450 tokens: 28 blocks of 16


def _entries(header: str) -> list[dict[str, str]]:
    entries = []
    for entry in header.split(","):
        address, *fields = entry.split(";")
        parsed = {"address": address}
        for field in fields:
            name, _, value = field.partition("=")
            parsed[name] = value
        entries.append(parsed)
    return entries


async def test_scores_header_and_regret_through_the_gateway(cluster: SimCluster, http):
    audit = {"regret": True, "scores_header": True, "scores_max_candidates": 2}
    router = await start_router(list(cluster.addresses), audit=audit)
    try:
        url = f"http://{router.address}/v1/completions"
        picked = []
        for i in range(4):
            body = {"model": cluster.model, "prompt": f"{PROMPT} turn {i}", "max_tokens": 2}
            async with http.post(url, json=body) as resp:
                assert resp.status == 200
                await resp.read()
                endpoint = resp.headers["x-slorouter-endpoint"]
                entries = _entries(resp.headers["x-slorouter-scores"])
                # Bounded at 2 of the 3 pods: the chosen one first, then the runner-up; one omitted.
                assert [e["address"] for e in entries] == [endpoint, resp.headers["x-slorouter-runner-up"]]
                assert resp.headers["x-slorouter-scores-omitted"] == "1"
                assert all(float(e["score"]) >= 0 and int(e["prefix"]) >= 0 for e in entries)
                picked.append((endpoint, int(entries[0]["prefix"])))
        # The default heuristic profile's prefix scorer: after the first turn the prompt's pod holds it.
        assert picked[0][1] == 0 and all(prefix > 0 for _, prefix in picked[1:])
        async with http.get(f"http://{router.address}{STATUS_PATH}") as resp:
            status = decode_status(await resp.read())
        assert status.regret is not None and status.regret.picks == 4
        assert status.regret.reuse_achieved == 1.0 and status.regret.avoidable_prefill_tokens == 0
        async with http.get(f"http://{router.address}/metrics") as resp:
            metrics = await resp.text()
        assert (
            'slorouter_routing_avoidable_prefill_tokens_count{profile="default",reason="score"} 4.0'
            in metrics
        )
    finally:
        await router.stop()


async def test_nothing_is_added_when_the_section_is_off(cluster: SimCluster, router, http):
    body = {"model": cluster.model, "prompt": PROMPT, "max_tokens": 2}
    async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()
        assert not any(name.lower().startswith("x-slorouter-scores") for name in resp.headers)
        assert "x-slorouter-runner-up" not in resp.headers
    async with http.get(f"http://{router.address}{STATUS_PATH}") as resp:
        assert decode_status(await resp.read()).regret is None
    async with http.get(f"http://{router.address}/metrics") as resp:
        assert "slorouter_routing_" not in await resp.text()
    assert router.director.record_picks is False


async def test_the_span_carries_the_scores_and_the_regret(cluster: SimCluster, http):
    exporter = InMemorySpanExporter()
    data: dict[str, Any] = {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "pool": {"endpoints": list(cluster.addresses), "scrape_interval_ms": 20},
        "tracing": {"enabled": True, "sampling": {"samplerArg": 1.0}},
        "audit": {"regret": True, "scores_header": True},
    }
    router = Router.build(parse_config(data), span_exporter=exporter)
    await router.start()
    try:
        body = {"model": cluster.model, "prompt": PROMPT, "max_tokens": 2}
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
            header = resp.headers["x-slorouter-scores"]
    finally:
        await router.stop()  # exports the spans still batched
    (request,) = [span for span in exporter.get_finished_spans() if span.parent is None]
    attributes = dict(request.attributes or {})
    assert attributes["slorouter.scores"] == header and len(header.split(",")) == 3
    assert attributes["slorouter.pick_reason"] == "score"
    assert attributes["slorouter.regret.reachable_prefix_tokens"] == 0  # the first request: all cold
