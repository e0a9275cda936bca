"""The scraper against real aiohttp servers on 127.0.0.1 serving /metrics text the tests control."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from slorouter.clock import ManualClock
from slorouter.pool.config import PoolConfig
from slorouter.pool.scraper import TASK_NAME_PREFIX, MetricsScraper, ScrapeStatus
from slorouter.pool.state import Endpoint, PoolState

BOUND_S = 10.0  # upper bound for conditions awaited in loops: a hang guard, not a speed claim


def page(waiting: int, running: int, kv: float, blocks: int = 1000) -> str:
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n'
        f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{blocks}"}} 1.0\n'
    )


class MetricsServer:
    """A model server stand-in whose /metrics body, status and delay the test sets."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.status = 200
        self.delay_s = 0.0
        self.hits = 0
        self.peers: set[tuple[str, int]] = set()
        self.accept_encoding: str | None = None
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _metrics(self, request: web.Request) -> web.Response:
        self.hits += 1
        self.accept_encoding = request.headers.get("Accept-Encoding")
        if request.transport is not None:
            self.peers.add(request.transport.get_extra_info("peername"))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return web.Response(text=self.body, status=self.status, content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)  # port 0 first, then the same port again
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


StartServer = Callable[[str], Awaitable[MetricsServer]]


@pytest.fixture
async def servers() -> AsyncIterator[StartServer]:
    started: list[MetricsServer] = []

    async def start(body: str) -> MetricsServer:
        server = MetricsServer(body)
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


async def eventually(check: Callable[[], bool], timeout: float = BOUND_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def status_of(scraper: MetricsScraper, address: str) -> ScrapeStatus:
    status = scraper.status(address)
    assert status is not None
    return status


def scraper_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(TASK_NAME_PREFIX)]


async def test_scrape_once_writes_metrics_with_the_clock_time(servers: StartServer) -> None:
    a, b = await servers(page(3, 12, 0.5, 27911)), await servers(page(0, 1, 0.125))
    pool = PoolState([Endpoint(a.address), Endpoint(b.address)])
    clock = ManualClock(100.0)
    scraper = MetricsScraper(pool, clock, interval_s=0.01)
    try:
        assert await scraper.scrape_once() == {a.address: True, b.address: True}
    finally:
        await scraper.stop()
    assert [
        pool.value(a.address, c) for c in ("waiting", "running", "kv_usage", "block_size", "num_gpu_blocks")
    ] == [
        3,
        12,
        0.5,
        16,
        27911,
    ]
    assert pool.value(b.address, "kv_usage") == 0.125
    assert pool.value(a.address, "metrics_time") == pool.value(b.address, "metrics_time") == 100.0
    status = status_of(scraper, a.address)
    assert (status.scrapes, status.last_success_at) == (1, 100.0)


async def test_polling_follows_the_server(servers: StartServer) -> None:
    server = await servers(page(1, 1, 0.1))
    pool = PoolState([Endpoint(server.address)])
    async with MetricsScraper(pool, ManualClock(), interval_s=0.01):
        await eventually(lambda: pool.value(server.address, "waiting") == 1)
        server.body = page(7, 2, 0.9)
        await eventually(lambda: pool.value(server.address, "waiting") == 7)
        assert pool.value(server.address, "kv_usage") == 0.9
    assert scraper_tasks() == []


async def test_unhealthy_after_n_failures_and_healthy_after_a_success(
    servers: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = await servers(page(1, 1, 0.1))
    pool = PoolState([Endpoint(server.address)])
    scraper = MetricsScraper(pool, ManualClock(), interval_s=0.01, timeout_s=2.0, unhealthy_after=3)
    caplog.set_level(logging.WARNING, logger="slorouter.pool.scraper")
    try:
        assert await scraper.scrape_once() == {server.address: True}
        await server.stop()
        for attempt in range(1, 4):
            assert pool.is_healthy(server.address)
            assert await scraper.scrape_once() == {server.address: False}
            assert status_of(scraper, server.address).consecutive_failures == attempt
        assert not pool.is_healthy(server.address)
        assert await scraper.scrape_once() == {server.address: False}
        assert [r.message for r in caplog.records if "unhealthy" in r.message] == [
            f"endpoint {server.address} is unhealthy: 3 consecutive metric scrapes failed "
            f"(last: {status_of(scraper, server.address).last_error})"
        ]
        await server.start()  # same port
        assert await scraper.scrape_once() == {server.address: True}
        assert pool.is_healthy(server.address)
        assert status_of(scraper, server.address).consecutive_failures == 0
        assert len(caplog.records) == 2 and "healthy again" in caplog.records[1].message
    finally:
        await scraper.stop()


async def test_polling_marks_a_stopped_server_unhealthy_and_a_restarted_one_healthy(
    servers: StartServer,
) -> None:
    server = await servers(page(1, 1, 0.1))
    pool = PoolState([Endpoint(server.address)])
    async with MetricsScraper(pool, ManualClock(), interval_s=0.01, unhealthy_after=2) as scraper:
        await eventually(lambda: pool.value(server.address, "waiting") == 1)
        await server.stop()
        await eventually(lambda: not pool.is_healthy(server.address))
        assert status_of(scraper, server.address).consecutive_failures >= 2
        await server.start()
        await eventually(lambda: pool.is_healthy(server.address))
    assert scraper_tasks() == []


@pytest.mark.parametrize(
    ("configure", "error"),
    [
        (lambda s: setattr(s, "status", 503), "HTTP 503"),
        (lambda s: setattr(s, "body", "<html>oops</html>"), "ParseError"),
        (
            lambda s: setattr(s, "body", page(1, 1, 0.1).replace("vllm:num_", "x:").replace("vllm:kv", "x")),
            "none of",
        ),
        (lambda s: setattr(s, "delay_s", 5.0), "TimeoutError"),
    ],
    ids=["status", "garbage", "missing-gauge", "timeout"],
)
async def test_failure_kinds(
    servers: StartServer, configure: Callable[[MetricsServer], None], error: str
) -> None:
    server = await servers(page(1, 1, 0.1))
    configure(server)
    pool = PoolState([Endpoint(server.address)])
    scraper = MetricsScraper(pool, ManualClock(), timeout_s=0.05, unhealthy_after=1)
    try:
        assert await scraper.scrape_once() == {server.address: False}
    finally:
        await scraper.stop()
    assert not pool.is_healthy(server.address)
    assert error in status_of(scraper, server.address).last_error
    assert pool.value(server.address, "metrics_time") == float("-inf")


LLAMA_SAYS = "This server does not support metrics endpoint. Start it with `--metrics`"
LLAMA_SERVER_501 = json.dumps({"error": {"code": 501, "message": LLAMA_SAYS, "type": "not_supported_error"}})


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (LLAMA_SERVER_501, f"HTTP 501: {LLAMA_SAYS}"),
        ("metrics are\n  disabled here", "HTTP 501: metrics are disabled here"),
        ("x" * 5000, "HTTP 501: " + "x" * 197 + "..."),
        ("", "HTTP 501"),
    ],
    ids=["llama-server-json", "text", "long", "empty"],
)
async def test_an_error_status_is_logged_with_what_the_server_says(
    servers: StartServer, caplog: pytest.LogCaptureFixture, body: str, said: str
) -> None:
    """llama-server started without --metrics answers 501 with an OpenAI-style error saying so: the
    unhealthy warning carries that message (a plain body: its start, on one line), not the status alone."""
    server = await servers(body)
    server.status = 501
    pool = PoolState([Endpoint(server.address)])
    scraper = MetricsScraper(pool, ManualClock(), unhealthy_after=1)
    with caplog.at_level(logging.WARNING, logger="slorouter.pool.scraper"):
        try:
            assert await scraper.scrape_once() == {server.address: False}
        finally:
            await scraper.stop()
    assert status_of(scraper, server.address).last_error == f"_BadStatus: {said}"
    assert f"(last: _BadStatus: {said})" in caplog.text


async def test_follows_endpoints_added_to_and_removed_from_the_pool(servers: StartServer) -> None:
    a, b = await servers(page(1, 1, 0.1)), await servers(page(2, 2, 0.2))
    pool = PoolState([Endpoint(a.address)])
    async with MetricsScraper(pool, ManualClock(5.0), interval_s=0.01) as scraper:
        await eventually(lambda: scraper.polled_addresses == {a.address})
        pool.add(Endpoint(b.address))
        await eventually(lambda: pool.value(b.address, "waiting") == 2)
        assert scraper.polled_addresses == {a.address, b.address}
        pool.remove(a.address)
        await eventually(lambda: scraper.polled_addresses == {b.address})
        assert scraper.status(a.address) is None
        hits = a.hits
        await eventually(lambda: b.hits >= hits + 3)  # b keeps being polled ...
        assert a.hits <= hits + 1  # ... and a is not (one scrape may have been in flight)
        assert len(scraper_tasks()) == 2  # supervisor + b
    assert scraper_tasks() == []


async def test_removal_during_a_scrape_is_harmless(servers: StartServer) -> None:
    server = await servers(page(1, 1, 0.1))
    server.delay_s = 0.05
    pool = PoolState([Endpoint(server.address), Endpoint("127.0.0.1:9")])
    scraper = MetricsScraper(pool, ManualClock())
    try:
        scrape = asyncio.create_task(scraper.scrape_once())
        await eventually(lambda: server.hits == 1)
        pool.remove(server.address)
        await scrape
        assert scraper.status(server.address) is None
    finally:
        await scraper.stop()


async def test_stop_cancels_everything_and_closes_its_own_session(servers: StartServer) -> None:
    server = await servers(page(1, 1, 0.1))
    server.delay_s = 3600  # a scrape is in flight when stop() comes
    pool = PoolState([Endpoint(server.address)])
    sessions: list[aiohttp.ClientSession] = []

    def factory() -> aiohttp.ClientSession:
        sessions.append(aiohttp.ClientSession())
        return sessions[-1]

    scraper = MetricsScraper(pool, ManualClock(), session=factory, interval_s=0.01, timeout_s=3600)
    scraper.start()
    scraper.start()  # no-op
    await eventually(lambda: server.hits >= 1)
    await scraper.stop()
    await scraper.stop()  # idempotent
    assert scraper_tasks() == []
    assert len(sessions) == 1 and sessions[0].closed
    assert not scraper.running


async def test_a_borrowed_session_is_left_open(servers: StartServer) -> None:
    server = await servers(page(4, 1, 0.1))
    pool = PoolState([Endpoint(server.address)])
    async with aiohttp.ClientSession() as session:
        scraper = MetricsScraper(pool, ManualClock(), session=session)
        await scraper.scrape_once()
        await scraper.stop()
        assert not session.closed
        assert pool.value(server.address, "waiting") == 4


async def test_connections_are_kept_alive_and_pages_uncompressed(servers: StartServer) -> None:
    server = await servers(page(1, 1, 0.1))
    pool = PoolState([Endpoint(server.address)])
    scraper = MetricsScraper(pool, ManualClock())
    try:
        for _ in range(5):
            assert await scraper.scrape_once() == {server.address: True}
    finally:
        await scraper.stop()
    assert server.hits == 5 and len(server.peers) == 1
    assert server.accept_encoding == "identity"


def test_from_config_and_argument_checks() -> None:
    pool = PoolState([Endpoint("a:1")])
    config = PoolConfig.model_validate(
        {
            "endpoints": ["a:1"],
            "scrape_interval_ms": 20,
            "scrape_timeout_ms": 300,
            "unhealthy_after_failures": 4,
        }
    )
    scraper = MetricsScraper.from_config(pool, ManualClock(), config)
    assert (scraper.interval_s, scraper.timeout.total, scraper.unhealthy_after) == (0.02, 0.3, 4)
    with pytest.raises(ValueError, match="interval_s"):
        MetricsScraper(pool, ManualClock(), interval_s=0)
    with pytest.raises(ValueError, match="unhealthy_after"):
        MetricsScraper(pool, ManualClock(), unhealthy_after=0)


async def test_a_missing_metric_is_reported_once_and_estimated_from_inflight(
    servers: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = await servers(page(2, 3, 0.5).replace("vllm:kv_cache_usage_perc", "vllm:other"))
    pool = PoolState([Endpoint(server.address)])
    scraper = MetricsScraper(pool, ManualClock())
    try:
        with caplog.at_level(logging.WARNING, logger="slorouter.pool.scraper"):
            for _ in range(3):
                assert await scraper.scrape_once() == {server.address: True}
        warnings = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
        assert warnings == [
            f"endpoint {server.address} (vllm metrics): its /metrics page lacks kv_usage "
            "(vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc); routing on the router's in-flight "
            "counts for it"
        ]
        # The page's cache: 1000 blocks of 16 tokens; 4000 in-flight tokens fill a quarter of it.
        assert pool.value(server.address, "kv_usage") == 0.0
        pool.add_inflight(server.address, 1, 3000, 1000)
        assert pool.value(server.address, "kv_usage") == 0.25
        assert (pool.value(server.address, "waiting"), pool.value(server.address, "running")) == (2, 3)
        assert pool.metric_dialects[server.address].name == "vllm"
    finally:
        await scraper.stop()


async def test_the_dialect_is_detected_on_the_first_scrape_and_configured_per_endpoint(
    servers: StartServer,
) -> None:
    sglang_page = "sglang:num_queue_reqs 4\nsglang:num_running_reqs 6\nsglang:token_usage 0.3\n"
    auto, configured = await servers(sglang_page), await servers(sglang_page)
    config = PoolConfig.model_validate(
        {"endpoints": [auto.address, {"address": configured.address, "model_server_type": "vllm"}]}
    )
    pool = PoolState([Endpoint(auto.address), Endpoint(configured.address)])
    scraper = MetricsScraper.from_config(pool, ManualClock(), config)
    try:
        # The endpoint configured as vLLM is read as vLLM: its SGLang page has none of vLLM's metrics.
        assert await scraper.scrape_once() == {auto.address: True, configured.address: False}
        assert scraper.dialect(auto.address).name == "sglang"  # type: ignore[union-attr]
        assert "vllm metrics page lacks" in scraper.status(configured.address).last_error  # type: ignore[union-attr]
        assert (pool.value(auto.address, "waiting"), pool.value(auto.address, "running")) == (4, 6)
        # A restart with another engine: the detected dialect finds nothing and is detected again.
        auto.body = page(1, 2, 0.125)
        assert (await scraper.scrape_once())[auto.address] is True
        assert scraper.dialect(auto.address).name == "vllm"  # type: ignore[union-attr]
        assert pool.value(auto.address, "kv_usage") == 0.125
    finally:
        await scraper.stop()
