"""Assembling and running a router: pool, scraper, in-flight tracker, scheduler, Director and gateway."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from slorouter.clock import Clock, MonotonicClock
from slorouter.config import Config, ConfigError
from slorouter.director import Director
from slorouter.gateway.app import Gateway
from slorouter.gateway.server import HttpServer
from slorouter.metrics import GatewayMetrics
from slorouter.pool.config import endpoints_from_config
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.scraper import MetricsScraper
from slorouter.pool.state import PoolState
from slorouter.scheduling.config import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext

log = logging.getLogger(__name__)


@dataclass
class Router:
    """Everything one running gateway needs, built from a validated ``Config``."""

    config: Config
    pool: PoolState
    director: Director
    gateway: Gateway
    scraper: MetricsScraper
    metrics: GatewayMetrics
    _server: HttpServer | None = field(default=None, repr=False)
    _scrape_session: aiohttp.ClientSession | None = field(default=None, repr=False)
    address: str = ""

    @classmethod
    def build(cls, config: Config, clock: Clock | None = None) -> Router:
        if config.pool is None:
            raise ConfigError("config: 'pool' is required (pool.endpoints lists the model servers)")
        clock = clock or MonotonicClock()
        pool = PoolState(endpoints_from_config(config.pool))
        ctx = PluginContext(clock=clock, rng=np.random.default_rng(config.seed), pool=pool)
        setup = build_scheduler_setup(config.scheduler, ctx)
        tracker = InFlightTracker(pool)
        director = Director(pool, setup, tracker, clock)
        metrics = GatewayMetrics(pool)
        tracker.register_metrics(metrics.registry)
        gateway = Gateway(config.gateway, director, metrics, clock)
        scraper = MetricsScraper.from_config(pool, clock, config.pool)
        return cls(config, pool, director, gateway, scraper, metrics)

    async def start(self) -> None:
        """Scrape every endpoint once, then serve; returns once the gateway is listening."""
        await self.scraper.scrape_once()
        self.scraper.start()
        await self.gateway.open()
        self._server = self.gateway.build_server()
        host, port = await self._server.start(self.config.gateway.host, self.config.gateway.port)
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        log.info("gateway listening on http://%s", self.address)

    async def stop(self) -> None:
        await self.scraper.stop()
        if self._server is not None:
            await self._server.close()
            self._server = None
        await self.gateway.close()
