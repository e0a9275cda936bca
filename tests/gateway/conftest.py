"""Fixtures that start real servers on 127.0.0.1: simulated pods, fake upstreams and the gateway."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from slorouter.config import parse_config
from slorouter.gateway.runtime import Router
from slorouter.sim.server import SimCluster, start_pods

IDLE_VLLM_METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="fake"} 0.0\n'
    'vllm:num_requests_waiting{model_name="fake"} 0.0\n'
    'vllm:kv_cache_usage_perc{model_name="fake"} 0.0\n'
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\n'
)
IDLE_SGLANG_METRICS = (
    "# TYPE sglang:num_running_reqs gauge\n"
    'sglang:num_running_reqs{model_name="fake"} 0.0\n'
    'sglang:num_queue_reqs{model_name="fake"} 0.0\n'
    'sglang:token_usage{model_name="fake"} 0.0\n'
)


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0) -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` seconds (a bound, not a speed claim)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def start_router(endpoints: list[str], **overrides: Any) -> Router:
    data: dict[str, Any] = {
        "gateway": {"host": "127.0.0.1", "port": 0, **overrides.pop("gateway", {})},
        "pool": {"endpoints": endpoints, "scrape_interval_ms": 20, **overrides.pop("pool", {})},
        "seed": 7,
        **overrides,
    }
    router = Router.build(parse_config(data))
    await router.start()
    return router


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    pods = await start_pods(3, 0, "llama3-8b-h100", seed=1)
    try:
        yield pods
    finally:
        await pods.close()


@pytest.fixture
async def router(cluster: SimCluster) -> AsyncIterator[Router]:
    r = await start_router(list(cluster.addresses))
    try:
        yield r
    finally:
        await r.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


class FakeUpstream:
    """A model server whose behaviour the test scripts: answers /metrics (an idle page of ``metrics``), runs
    ``handler`` for inference."""

    def __init__(
        self,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        metrics: str = IDLE_VLLM_METRICS,
    ) -> None:
        self.handler = handler
        self.metrics = metrics
        self.calls = 0
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def start(self) -> FakeUpstream:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._inference)
        app.router.add_post("/v1/chat/completions", self._inference)
        # A handler still running when the test closes the upstream (one that hangs) is cancelled after 0.1 s;
        # aiohttp's default waits up to 60 s for it.
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.address = f"{host}:{port}"
        return self

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=self.metrics)

    async def _inference(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        return await self.handler(request)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


COMPLETION_REPLY = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "fake",
    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
}


@dataclass
class Received:
    request_id: str
    content_length: int | None
    body: bytes
    transfer_encoding: str | None = None

    @property
    def json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Recorder:
    """A ``FakeUpstream`` handler that records the requests reaching it and answers a completion;
    ``fail``: it drops the connection instead."""

    fail: bool = False
    received: list[Received] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = request.headers
        self.received.append(
            Received(
                headers.get("x-request-id", ""),
                request.content_length,
                body,
                headers.get("transfer-encoding"),
            )
        )
        if self.fail:
            assert request.transport is not None
            request.transport.abort()
        return web.json_response(COMPLETION_REPLY)
