"""What the pods' scrapes say about their KV events: a pod that serves while its events are silent, a pod
whose process restarted although its event sequence did not go back.

The subscriber sees only the event stream; a stream that simply stops, or a restarted engine whose events
resume in a number range the subscriber accepts as a continuation, looks healthy from there. The scrape
(``PoolState.serving``) tells otherwise: the pod runs requests, or its prefix-cache query counter moves, yet
no batch came for ``silent_after_s`` (degraded, ``silent``); its ``process_start_time_seconds`` changed, or
its prefix-cache query counter went back (the pod's blocks are cleared, ``rebuilding``, reason
``process-restart``). ``check`` does this once for every pod with a trust state, and lets the time-based
rules act; ``run`` calls it every ``interval_s``.
"""

from __future__ import annotations

import asyncio
import logging

from slorouter.clock import Clock
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_trust import TrustReason
from slorouter.pool.state import PoolState, ServingSignals

logger = logging.getLogger(__name__)


def restarted(before: ServingSignals, after: ServingSignals) -> bool:
    """Whether two scrapes of one endpoint are of two processes."""
    started = before.process_start_s, after.process_start_s
    if None not in started and started[0] != started[1]:
        return True
    if before.prefix_cache_queries is not None and after.prefix_cache_queries is not None:
        return after.prefix_cache_queries < before.prefix_cache_queries
    return False


def busy(before: ServingSignals | None, after: ServingSignals) -> bool:
    """Whether the scrape shows the pod serving: requests running, or prefix-cache queries since the last."""
    if after.running:
        return True
    if before is None or before.prefix_cache_queries is None or after.prefix_cache_queries is None:
        return False
    return after.prefix_cache_queries > before.prefix_cache_queries


class KVTrustMonitor:
    def __init__(
        self, pool: PoolState, index: KVBlockIndex, clock: Clock, *, interval_s: float = 0.5
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.pool = pool
        self.index = index
        self.clock = clock
        self.interval_s = interval_s
        self._seen: dict[str, ServingSignals] = {}  # the last scrape looked at, per address
        self._task: asyncio.Task[None] | None = None

    def check(self) -> None:
        now = self.clock.now()
        trust = self.index.trust
        addresses = trust.addresses
        for address in [a for a in self._seen if a not in addresses]:
            del self._seen[address]
        for address in addresses:
            signals = self.pool.serving.get(address)
            before = self._seen.get(address)
            if signals is not None and (before is None or signals.at > before.at):
                self._seen[address] = signals
                if before is not None and restarted(before, signals):
                    logger.warning("KV events of %s: its process restarted; clearing its blocks", address)
                    self.index.clear_pod(address, TrustReason.PROCESS_RESTART)
                pod = trust.get(address)
                if pod is not None:
                    pod.serving(now, busy=busy(before, signals))
        trust.tick(now)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kv-trust-monitor")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        # At once first: a restart can only be told from the scrape the monitor saw before it.
        interval = self.interval_s
        while True:
            try:
                self.check()
            except Exception:  # a bug: keep the trust states moving all the same
                logger.exception("KV-event trust: checking the pods' scrapes failed")
            await asyncio.sleep(interval)
