"""Keep the pool's scraped columns fresh: poll every endpoint's ``/metrics`` on a fixed interval.

Each endpoint gets its own asyncio task, so a slow or hung server only delays its own scrapes. A supervisor
task follows the pool's membership (endpoints added or removed by discovery) once per interval;
``sync_endpoints()`` does the same on demand. All scrapes share one aiohttp session whose keep-alive
connection pool keeps one warm connection per endpoint.

Health: an endpoint is marked unhealthy after ``unhealthy_after`` consecutive failed scrapes (connection
error, timeout, non-200 status, unparsable page) and healthy again after ``healthy_after`` consecutive
successful ones. Only these transitions are logged as warnings; single failures are logged at debug level.

Dialects: each endpoint's page is read in the dialect its configuration gives (``dialect_resolver``), or the
one detected on its first readable scrape (kept until a scrape finds none of its metrics, then detected
again). A signal the page lacks is logged once per endpoint as a warning naming the metric; the pool then
estimates it from in-flight counts and ``slorouter_endpoint_metric_missing`` shows it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import aiohttp

from slorouter.clock import Clock
from slorouter.pool.config import DialectResolver, PoolConfig, dialect_resolver
from slorouter.pool.dialects import Dialect
from slorouter.pool.metrics_parser import ParseError, detect_dialect, parse_metrics
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState

log = logging.getLogger(__name__)

SessionFactory = Callable[[], aiohttp.ClientSession]
TASK_NAME_PREFIX = "slorouter-scrape"
# prometheus_client gzips the page for clients that accept it; on a cluster network inflating ~50 kB every
# 50 ms costs more CPU than the parse, so ask for it uncompressed (and in the classic text format).
SCRAPE_HEADERS = {"Accept-Encoding": "identity", "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1"}


# Of a page answered with another status than 200, this much is read: its explanation, for the log.
_ERROR_BODY_BYTES = 1024
_ERROR_TEXT_CHARS = 200


class _BadStatus(Exception):
    pass


def _error_text(body: bytes) -> str:
    """What a server says with an error status, on one line: the message of an OpenAI-style JSON error
    (``{"error": {"message": ...}}``; llama-server started without ``--metrics`` says to start it with it),
    else the body's start."""
    try:
        message = json.loads(body)["error"]["message"]
        text = message if isinstance(message, str) else body.decode("utf-8", "replace")
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError is a ValueError
        text = body.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_TEXT_CHARS else text[: _ERROR_TEXT_CHARS - 3] + "..."


@dataclass(slots=True)
class ScrapeStatus:
    """Scrape history of one endpoint (what the health decision is based on)."""

    consecutive_failures: int = 0
    consecutive_successes: int = 0
    scrapes: int = 0
    failures: int = 0
    last_error: str = ""
    last_success_at: float = -math.inf


def default_session() -> aiohttp.ClientSession:
    # No connection limit: every endpoint needs its own keep-alive connection, and the per-endpoint tasks
    # already cap concurrency at one scrape per endpoint.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30))


class MetricsScraper:
    """Scrapes every endpoint of ``pool`` and writes ``set_metrics``/``set_healthy``.

    ``session`` is either a ``ClientSession`` (borrowed: the caller closes it) or a factory called on first
    use (owned: closed by ``stop()``); by default the scraper makes its own session.
    """

    def __init__(
        self,
        pool: PoolState,
        clock: Clock,
        *,
        session: aiohttp.ClientSession | SessionFactory | None = None,
        interval_s: float = 0.05,
        timeout_s: float = 1.0,
        unhealthy_after: int = 3,
        healthy_after: int = 1,
        path: str = "/metrics",
        dialects: DialectResolver | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(f"interval_s and timeout_s must be > 0 (got {interval_s}, {timeout_s})")
        if unhealthy_after < 1 or healthy_after < 1:
            raise ValueError(
                f"unhealthy_after and healthy_after must be >= 1 (got {unhealthy_after}, {healthy_after})"
            )
        self.pool = pool
        self.clock = clock
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.unhealthy_after = unhealthy_after
        self.healthy_after = healthy_after
        self.path = path
        if isinstance(session, aiohttp.ClientSession):
            self._session: aiohttp.ClientSession | None = session
            self._session_factory: SessionFactory | None = None
        else:
            self._session = None
            self._session_factory = session or default_session
        self._status: dict[str, ScrapeStatus] = {}
        self._resolve: DialectResolver = dialects or (lambda endpoint: None)
        self._detected: dict[str, Dialect] = {}  # auto-detected dialects, by address
        self._reported: dict[str, set[str]] = {}  # missing signals already logged, by address
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._supervisor: asyncio.Task[None] | None = None

    @classmethod
    def from_config(
        cls,
        pool: PoolState,
        clock: Clock,
        config: PoolConfig,
        session: aiohttp.ClientSession | SessionFactory | None = None,
    ) -> MetricsScraper:
        return cls(
            pool,
            clock,
            session=session,
            interval_s=config.scrape_interval_s,
            timeout_s=config.scrape_timeout_s,
            unhealthy_after=config.unhealthy_after_failures,
            dialects=dialect_resolver(config),
        )

    # --- lifecycle -----------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._supervisor is not None

    def start(self) -> None:
        """Start polling (needs a running event loop); a no-op when already running."""
        if self._supervisor is not None:
            return
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"{TASK_NAME_PREFIX}-supervisor"
        )

    async def stop(self) -> None:
        """Cancel every scrape task, wait for them, and close the session if the scraper owns it."""
        tasks = [*self._tasks.values(), *self._retiring]
        if self._supervisor is not None:
            tasks.append(self._supervisor)
        self._supervisor = None
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._retiring.clear()
            if self._session_factory is not None and self._session is not None:
                session, self._session = self._session, None
                await session.close()

    async def __aenter__(self) -> MetricsScraper:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- membership ----------------------------------------------------------------------------------
    def sync_endpoints(self) -> None:
        """Start tasks for endpoints new to the pool and cancel those of endpoints that left it.

        Tasks are only started while the scraper runs; statuses of departed endpoints are dropped always.
        """
        current = {endpoint.address for endpoint in self.pool.endpoints}
        for address in [a for a in self._status if a not in current]:
            del self._status[address]
        for table in (self._detected, self._reported):
            for address in [a for a in table if a not in current]:
                del table[address]
        for address in [a for a in self._tasks if a not in current]:
            task = self._tasks.pop(address)
            task.cancel()
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        if self._supervisor is None:
            return
        loop = asyncio.get_running_loop()
        for address in current.difference(self._tasks):
            self._tasks[address] = loop.create_task(self._poll(address), name=f"{TASK_NAME_PREFIX}:{address}")

    def status(self, address: str) -> ScrapeStatus | None:
        return self._status.get(address)

    @property
    def polled_addresses(self) -> frozenset[str]:
        """Endpoints that currently have a polling task."""
        return frozenset(self._tasks)

    # --- scraping ------------------------------------------------------------------------------------
    async def scrape_once(self) -> dict[str, bool]:
        """Scrape every endpoint now, concurrently; returns whether each scrape succeeded."""
        self.sync_endpoints()
        addresses = [endpoint.address for endpoint in self.pool.endpoints]
        results = await asyncio.gather(*(self._scrape(address) for address in addresses))
        return dict(zip(addresses, results, strict=True))

    async def _supervise(self) -> None:
        while True:
            try:
                self.sync_endpoints()
            except Exception:
                log.exception("metrics scraper: following the pool's endpoints failed")
            await asyncio.sleep(self.interval_s)

    async def _poll(self, address: str) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self._scrape(address)
            except Exception:
                log.exception("metrics scraper: recording the scrape of %s failed", address)
            next_at += self.interval_s
            delay = next_at - loop.time()
            if delay < 0:  # the scrape overran its slot: start again now rather than in a burst
                next_at, delay = loop.time(), 0.0
            await asyncio.sleep(delay)

    async def _scrape(self, address: str) -> bool:
        """One scrape of one endpoint, recorded in the pool; never raises (except on cancellation)."""
        endpoint = self.pool.get(address)
        if endpoint is None:
            return False
        try:
            text = await self._fetch(endpoint.url + self.path)
            dialect, snapshot = self._read(endpoint, text)
        except (
            aiohttp.ClientError,
            TimeoutError,
            OSError,
            ParseError,
            UnicodeDecodeError,
            _BadStatus,
        ) as exc:
            self._record_failure(address, _describe(exc))
            return False
        except Exception as exc:  # a bug, not a sick endpoint: log it loudly but keep polling
            log.exception("metrics scraper: unexpected error scraping %s", address)
            self._record_failure(address, _describe(exc))
            return False
        self._record_success(address, snapshot, dialect)
        return True

    def dialect(self, address: str) -> Dialect | None:
        """The dialect an endpoint's page is read in (configured, or detected; ``None``: not yet known)."""
        endpoint = self.pool.get(address)
        configured = self._resolve(endpoint) if endpoint is not None else None
        return configured or self._detected.get(address)

    def _read(self, endpoint: Endpoint, text: str) -> tuple[Dialect, MetricsSnapshot]:
        address = endpoint.address
        dialect = self._resolve(endpoint)
        if dialect is not None:
            return dialect, parse_metrics(text, dialect)
        detected = self._detected.get(address)
        if detected is not None:
            try:
                return detected, parse_metrics(text, detected)
            except ParseError:
                del self._detected[address]  # another server now (a restart with another engine)?
                self._reported.pop(address, None)
        detected = detect_dialect(text)
        snapshot = parse_metrics(text, detected)  # with None: the error naming every preset's metrics
        assert detected is not None
        self._detected[address] = detected
        log.info("endpoint %s: metrics page detected as %s", address, detected.name)
        return detected, snapshot

    async def _fetch(self, url: str) -> str:
        session = self._get_session()
        async with session.get(url, timeout=self.timeout, headers=SCRAPE_HEADERS) as response:
            if response.status != 200:
                said = _error_text(await response.content.read(_ERROR_BODY_BYTES))
                raise _BadStatus(f"HTTP {response.status}: {said}" if said else f"HTTP {response.status}")
            body = await response.read()
        return body.decode("utf-8")

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if self._session_factory is None:
                raise RuntimeError("metrics scraper: the borrowed ClientSession was closed")
            self._session = self._session_factory()
        return self._session

    # --- health bookkeeping --------------------------------------------------------------------------
    def _record_failure(self, address: str, error: str) -> None:
        if address not in self.pool:
            return
        status = self._status.setdefault(address, ScrapeStatus())
        status.scrapes += 1
        status.failures += 1
        status.consecutive_failures += 1
        status.consecutive_successes = 0
        status.last_error = error
        if status.consecutive_failures >= self.unhealthy_after and self.pool.is_healthy(address):
            self.pool.set_healthy(address, False)
            log.warning(
                "endpoint %s is unhealthy: %d consecutive metric scrapes failed (last: %s)",
                address,
                status.consecutive_failures,
                error,
            )
        else:
            log.debug("metrics scrape of %s failed: %s", address, error)

    def _record_success(self, address: str, snapshot: MetricsSnapshot, dialect: Dialect) -> None:
        if address not in self.pool:  # removed while the scrape was in flight
            return
        now = self.clock.now()
        self.pool.set_metrics(address, snapshot, at=now)
        self.pool.metric_dialects[address] = dialect
        if snapshot.missing:
            reported = self._reported.setdefault(address, set())
            for signal in snapshot.missing:
                if signal not in reported:
                    reported.add(signal)
                    log.warning(
                        "endpoint %s (%s metrics): its /metrics page lacks %s (%s); routing on the "
                        "router's in-flight counts for it",
                        address,
                        dialect.name,
                        signal,
                        dialect.describe(signal),
                    )
        status = self._status.setdefault(address, ScrapeStatus())
        status.scrapes += 1
        status.consecutive_successes += 1
        status.consecutive_failures = 0
        status.last_success_at = now
        if status.consecutive_successes >= self.healthy_after and not self.pool.is_healthy(address):
            self.pool.set_healthy(address, True)
            log.warning("endpoint %s is healthy again: its metrics scrape succeeded", address)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
