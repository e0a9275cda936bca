"""What the gateway answers when a model server misbehaves (scripted fake upstreams, in-process); the same
faults against real processes: tests/reliability."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from slorouter.gateway.relay import looks_like_json, looks_like_sse
from tests.gateway.conftest import FakeUpstream, eventually, start_router

BODY = {"model": "fake", "prompt": "hi", "max_tokens": 4}
TIMEOUTS = {"upstream_first_byte_timeout_s": 0.3, "upstream_idle_timeout_s": 0.3}


def _inflight(router) -> int:
    return int(router.pool.columns["inflight_requests"].sum())


async def _hang(request: web.Request) -> web.StreamResponse:
    await request.read()
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def test_an_upstream_that_hangs_gets_504_without_retry(http):
    hanging = [await FakeUpstream(_hang).start() for _ in range(2)]
    router = await start_router([u.address for u in hanging], gateway=TIMEOUTS)
    try:
        for stream in (False, True):
            body = {**BODY, "stream": stream}
            async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
                assert resp.status == 504
                error = (await resp.json())["error"]
            assert error["type"] == "GatewayTimeoutError"
            assert "no response byte within 0.3 s" in error["message"]
        assert sum(u.calls for u in hanging) == 2  # one per request: a timeout is not retried
        await eventually(lambda: _inflight(router) == 0)
    finally:
        await router.stop()
        for upstream in hanging:
            await upstream.close()


async def test_a_stream_that_stalls_ends_with_a_504_error_event_and_done(http):
    async def stalls(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n')
        await asyncio.sleep(3600)
        return response

    upstream = await FakeUpstream(stalls).start()
    router = await start_router([upstream.address], gateway=TIMEOUTS)
    try:
        body = {**BODY, "stream": True}
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 200
            text = (await resp.read()).decode()
        assert text.endswith("data: [DONE]\n\n")
        assert '"code": 504' in text and "stalled" in text
        await eventually(lambda: _inflight(router) == 0)
    finally:
        await router.stop()
        await upstream.close()


async def _not_json(request: web.Request) -> web.StreamResponse:
    await request.read()
    return web.Response(body=b"<html>oops</html>", content_type="text/html")


async def _not_sse(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"this is not server-sent events\n\n")
    await response.write_eof()
    return response


async def _first_event_cut(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices": [{"ind')
    assert request.transport is not None
    request.transport.abort()
    return response


async def test_bad_answers_before_any_byte_are_retried_then_502(cluster, http):
    for handler, stream, needle in (
        (_not_json, False, "not a JSON object"),
        (_not_sse, True, "not SSE"),
        (_first_event_cut, True, "closed before the response was complete"),
    ):
        bad = await FakeUpstream(handler).start()
        other_bad = await FakeUpstream(handler).start()
        router = await start_router([bad.address, cluster.addresses[0]])
        only_bad = await start_router([bad.address, other_bad.address])
        try:
            body = {"model": cluster.model, "prompt": "hi", "max_tokens": 3, "stream": stream}
            for _ in range(20):  # until the bad endpoint was picked first at least once
                async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    assert resp.headers["x-slorouter-endpoint"] == cluster.addresses[0]
                    assert b'"error"' not in await resp.read()
                if bad.calls:
                    break
            assert bad.calls >= 1
            async with http.post(f"http://{only_bad.address}/v1/completions", json=body) as resp:
                assert resp.status == 502
                error = (await resp.json())["error"]
            assert needle in error["message"] and error["type"] == "BadGatewayError"
            assert "slorouter_upstream_retries_total 1.0" in only_bad.metrics.render().decode()
            routers = (router, only_bad)
            await eventually(lambda rs=routers: all(_inflight(r) == 0 for r in rs))
        finally:
            await router.stop()
            await only_bad.stop()
            await bad.close()
            await other_bad.close()


async def test_a_body_over_the_bound_gets_502_without_retry(http):
    async def huge(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(body=b'{"pad": "' + b"x" * 300_000 + b'"}', content_type="application/json")

    upstreams = [await FakeUpstream(huge).start() for _ in range(2)]
    router = await start_router([u.address for u in upstreams], gateway={"max_upstream_body_bytes": 100_000})
    try:
        async with http.post(f"http://{router.address}/v1/completions", json=BODY) as resp:
            assert resp.status == 502
            assert "larger than 100000 bytes" in (await resp.json())["error"]["message"]
        assert sum(u.calls for u in upstreams) == 1
        await eventually(lambda: _inflight(router) == 0)
    finally:
        await router.stop()
        for upstream in upstreams:
            await upstream.close()


@pytest.mark.parametrize(
    ("body", "json_shaped"),
    [(b'{"a": 1}', True), (b' \n{"a": 1}\r\n', True), (b"{}", True), (b"{", False), (b"", False),
     (b"  ", False), (b"<html>", False), (b'{"a": ', False)],
)  # fmt: skip
def test_the_json_shape_check(body, json_shaped):
    assert looks_like_json(body) is json_shaped


@pytest.mark.parametrize(
    ("first", "sse"),
    [(b"data: x\n\n", True), (b"\n\ndata: x", True), (b": ping\n\n", True), (b"da", True),
     (b"event: e\n", True), (b"\r\n", True), (b"this is not", False), (b"{json}", False)],
)  # fmt: skip
def test_the_sse_start_check(first, sse):
    assert looks_like_sse(first) is sse
