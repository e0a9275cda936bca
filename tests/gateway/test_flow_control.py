"""Flow control through the gateway: requests held while the pool is saturated, dispatched when a slot
frees, removed when their client goes away, and turned away at the limits with OpenAI-style errors.

One fake upstream answers only when the test opens its gate; the detector allows one request in flight.
After every test the queue, the reservations and the in-flight counts are back to zero.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from slorouter.gateway.runtime import Router
from tests.gateway.conftest import FakeUpstream, eventually, start_router

BODY = {"model": "m", "prompt": "hello there", "max_tokens": 4}


class Gate:
    def __init__(self) -> None:
        self.open = asyncio.Event()

    async def handler(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        await self.open.wait()
        return web.json_response(
            {
                "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )


async def _router(upstream: FakeUpstream, **flow: Any) -> Router:
    return await start_router(
        [upstream.address],
        flowControl={"enabled": True, "saturationDetector": {"maxInflightRequestsPerEndpoint": 1}, **flow},
    )


def _queued(router: Router) -> int:
    controller = router.director.flow_control
    assert controller is not None
    return len(controller)


async def _idle(router: Router) -> None:
    controller = router.director.flow_control
    assert controller is not None
    await eventually(lambda: int(router.pool.columns["inflight_requests"].sum()) == 0)
    assert len(controller) == 0 and controller.reserved == 0
    metrics = router.metrics.render().decode()
    assert 'slorouter_flow_control_queue_size{priority="0"} 0.0' in metrics


async def _post(http: aiohttp.ClientSession, router: Router, **kw: Any) -> aiohttp.ClientResponse:
    return await http.post(f"http://{router.address}/v1/completions", json=BODY, **kw)


async def test_a_queued_request_is_dispatched_when_the_slot_frees(http: aiohttp.ClientSession) -> None:
    gate = Gate()
    upstream = await FakeUpstream(gate.handler).start()
    router = await _router(upstream)
    try:
        first = asyncio.create_task(_post(http, router))
        await eventually(lambda: upstream.calls == 1)
        second = asyncio.create_task(_post(http, router))
        await eventually(lambda: _queued(router) == 1)
        assert upstream.calls == 1  # held in the router, not sent to the saturated pod
        gate.open.set()
        for task in (first, second):
            response = await task
            assert response.status == 200
            assert float(response.headers["x-slorouter-queued-ms"]) >= 0
            response.release()
        assert upstream.calls == 2
        await _idle(router)
        assert 'outcome="dispatched"' in router.metrics.render().decode()
    finally:
        gate.open.set()
        await router.stop()
        await upstream.close()


async def test_a_client_that_disconnects_while_queued_leaves_the_queue(http: aiohttp.ClientSession) -> None:
    gate = Gate()
    upstream = await FakeUpstream(gate.handler).start()
    router = await _router(upstream)
    try:
        first = asyncio.create_task(_post(http, router))
        await eventually(lambda: upstream.calls == 1)
        async with aiohttp.ClientSession() as impatient:
            waiting = asyncio.create_task(_post(impatient, router))
            await eventually(lambda: _queued(router) == 1)
            waiting.cancel()
        await eventually(lambda: _queued(router) == 0)
        assert 'outcome="cancelled"' in router.metrics.render().decode()
        gate.open.set()
        response = await first
        assert response.status == 200
        response.release()
        assert upstream.calls == 1  # the one that left was never sent
        await _idle(router)
    finally:
        gate.open.set()
        await router.stop()
        await upstream.close()


async def test_limits_answer_429_and_the_ttl_503(http: aiohttp.ClientSession) -> None:
    gate = Gate()
    upstream = await FakeUpstream(gate.handler).start()
    router = await _router(upstream, maxRequests=1, defaultRequestTTL="300ms")
    try:
        first = asyncio.create_task(_post(http, router))
        await eventually(lambda: upstream.calls == 1)
        queued = asyncio.create_task(_post(http, router))
        await eventually(lambda: _queued(router) == 1)
        full = await _post(http, router)
        assert full.status == 429
        error = (await full.json())["error"]
        assert error["type"] == "RateLimitError" and "queue is full" in error["message"]
        assert float(full.headers["x-slorouter-queued-ms"]) < 300  # refused on arrival, not held
        expired = await queued
        assert expired.status == 503
        assert float(expired.headers["x-slorouter-queued-ms"]) >= 300  # it waited out its TTL
        assert (await expired.json())["error"]["type"] == "ServiceUnavailableError"
        gate.open.set()
        response = await first
        assert response.status == 200
        response.release()
        await _idle(router)
    finally:
        gate.open.set()
        await router.stop()
        await upstream.close()
