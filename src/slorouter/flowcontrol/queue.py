"""The queued requests: strict priority bands, fair flows inside a band, an ordering inside a flow.

Rules (every one tested in tests/flowcontrol/):

- ``add`` queues a request unless a limit would be exceeded: its band's ``maxRequests`` / ``maxBytes``, or
  the global ones. A global limit may be met by evicting queued *sheddable* requests of a strictly lower
  priority (lowest priority first, newest first); if even evicting all of them would not make room, nothing is
  evicted and the request is rejected. Non-sheddable requests are never evicted.
- ``pop`` takes the highest band with requests, the flow its fairness policy picks, that flow's first request
  by the ordering policy.
- ``due`` removes what is due by ``now``: requests queued past their TTL (expired), and sheddable requests
  past their SLO deadline (evicted: they can no longer meet it).
- ``remove`` takes a request out at once (its client went away).

Removed requests leave stale entries in the heaps; they are skipped when met (``QueuedRequest.queued``).
Not thread-safe: owned by one event loop or the discrete-event simulator.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from slorouter.flowcontrol.policies import FairnessPolicy, ordering_key
from slorouter.flowcontrol.types import AddResult, FlowKey, Limits, Outcome, QueuedRequest, Rejection


@dataclass(slots=True)
class _Flow:
    heap: list[tuple[tuple[float, int], QueuedRequest]] = field(default_factory=list)
    count: int = 0


@dataclass(slots=True)
class _Band:
    limits: Limits
    fairness: FairnessPolicy
    flows: dict[FlowKey, _Flow] = field(default_factory=dict)
    backlogged: dict[FlowKey, None] = field(default_factory=dict)  # an ordered set: deterministic runs
    count: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class FlowStats:
    flow: FlowKey
    queued: int
    oldest_arrival: float


class FlowQueues:
    def __init__(
        self,
        *,
        fairness: Callable[[], FairnessPolicy],
        ordering: str = "fcfs",
        limits: Limits | None = None,
        band_limits: Mapping[int, Limits] | None = None,
        default_band_limits: Limits | None = None,
    ) -> None:
        self._new_fairness = fairness
        self._key = ordering_key(ordering)
        self.limits = limits or Limits()
        self._band_limits = dict(band_limits or {})
        self._default_band_limits = default_band_limits or Limits()
        self._bands: dict[int, _Band] = {}
        self._priorities: list[int] = []  # descending
        self._timers: list[tuple[float, int, QueuedRequest]] = []
        self._seq = itertools.count()
        self.count = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self.count

    # --- entering ------------------------------------------------------------------------------------
    def add(self, item: QueuedRequest) -> AddResult:
        if item.queued:
            raise ValueError(f"request {item.request_id} is queued already")
        band = self._band(item.priority)
        rejection = self._band_rejection(band, item)
        if rejection is not None:
            return AddResult(rejection)
        victims: list[QueuedRequest] | None = []
        need_requests, need_bytes = self._global_excess(item)
        if need_requests > 0 or need_bytes > 0:
            victims = self._victims(item.priority, need_requests, need_bytes)
            if victims is None:
                return AddResult(self._global_rejection(need_requests > 0))
            for victim in victims:
                self._take_out(victim)
        assert victims is not None
        item.seq = next(self._seq)
        item.queued = True
        flow = band.flows.get(item.flow)
        if flow is None:
            flow = band.flows[item.flow] = _Flow()
        heapq.heappush(flow.heap, (self._key(item), item))
        flow.count += 1
        band.backlogged[item.flow] = None
        band.count += 1
        band.bytes += item.size_bytes
        self.count += 1
        self.bytes += item.size_bytes
        for deadline in (item.ttl_deadline, item.slo_deadline if item.sheddable else None):
            if deadline is not None:
                heapq.heappush(self._timers, (deadline, item.seq, item))
        return AddResult(None, tuple(victims))

    def _band(self, priority: int) -> _Band:
        band = self._bands.get(priority)
        if band is None:
            limits = self._band_limits.get(priority, self._default_band_limits)
            band = self._bands[priority] = _Band(limits, self._new_fairness())
            self._priorities = sorted(self._bands, reverse=True)
        return band

    def _band_rejection(self, band: _Band, item: QueuedRequest) -> Rejection | None:
        limits = band.limits
        if limits.max_requests is not None and band.count + 1 > limits.max_requests:
            return Rejection(
                "maxRequests",
                f"the queue of priority {item.priority} is full ({limits.max_requests} requests)",
            )
        if limits.max_bytes is not None and band.bytes + item.size_bytes > limits.max_bytes:
            return Rejection(
                "maxBytes", f"the queue of priority {item.priority} is full ({limits.max_bytes} bytes)"
            )
        return None

    def _global_excess(self, item: QueuedRequest) -> tuple[int, int]:
        limits = self.limits
        need_requests = 0 if limits.max_requests is None else self.count + 1 - limits.max_requests
        need_bytes = 0 if limits.max_bytes is None else self.bytes + item.size_bytes - limits.max_bytes
        return need_requests, need_bytes

    def _global_rejection(self, requests: bool) -> Rejection:
        if requests:
            return Rejection("maxRequests", f"the queue is full ({self.limits.max_requests} requests)")
        return Rejection("maxBytes", f"the queue is full ({self.limits.max_bytes} bytes)")

    def _victims(self, priority: int, need_requests: int, need_bytes: int) -> list[QueuedRequest] | None:
        """Sheddable requests of lower priority whose eviction makes room (lowest priority, newest first);
        None when all of them would not be enough."""
        candidates = [
            item
            for p in reversed(self._priorities)
            if p < priority
            for item in self._band_items(self._bands[p])
            if item.sheddable
        ]
        candidates.sort(key=lambda item: (item.priority, -item.arrival, -item.seq))
        chosen: list[QueuedRequest] = []
        for item in candidates:
            if need_requests <= 0 and need_bytes <= 0:
                break
            chosen.append(item)
            need_requests -= 1
            need_bytes -= item.size_bytes
        if need_requests > 0 or need_bytes > 0:
            return None
        return chosen

    # --- leaving -------------------------------------------------------------------------------------
    def pop(self, now: float) -> QueuedRequest | None:
        """The next request to dispatch (None when empty)."""
        for priority in self._priorities:
            band = self._bands[priority]
            if not band.count:
                continue
            key = band.fairness.pick(band.backlogged, now)
            heap = band.flows[key].heap
            while True:
                _, item = heapq.heappop(heap)
                if item.queued:
                    break
            self._take_out(item)
            band.fairness.served(key, item.cost_tokens, now)
            return item
        return None

    def remove(self, item: QueuedRequest) -> bool:
        """Take a queued request out (its client went away); False if it is not queued."""
        if not item.queued:
            return False
        self._take_out(item)
        return True

    def due(self, now: float) -> list[tuple[QueuedRequest, Outcome]]:
        """Remove what is due by ``now``: EXPIRED past its TTL, EVICTED (sheddable) past its SLO."""
        out: list[tuple[QueuedRequest, Outcome]] = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, item = heapq.heappop(timers)
            if not item.queued:
                continue
            expired = item.ttl_deadline is not None and item.ttl_deadline <= now
            self._take_out(item)
            out.append((item, Outcome.EXPIRED if expired else Outcome.EVICTED))
        return out

    def next_deadline(self) -> float | None:
        """When ``due`` will next have something to remove (None: no timer)."""
        timers = self._timers
        while timers and not timers[0][2].queued:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def served(self, flow: FlowKey, tokens: float, now: float) -> None:
        """Charge a flow for tokens served after dispatch (the reply's), for least-attained-service."""
        band = self._bands.get(flow.priority)
        if band is not None:
            band.fairness.served(flow, tokens, now)

    def _take_out(self, item: QueuedRequest) -> None:
        item.queued = False
        band = self._bands[item.priority]
        flow = band.flows[item.flow]
        flow.count -= 1
        if not flow.count:
            flow.heap.clear()  # only stale entries are left
            del band.backlogged[item.flow]
            del band.flows[item.flow]
        band.count -= 1
        band.bytes -= item.size_bytes
        self.count -= 1
        self.bytes -= item.size_bytes

    # --- reading -------------------------------------------------------------------------------------
    def _band_items(self, band: _Band) -> Iterator[QueuedRequest]:
        for flow in band.flows.values():
            for _, item in flow.heap:
                if item.queued:
                    yield item

    def items(self) -> Iterator[QueuedRequest]:
        for priority in self._priorities:
            yield from self._band_items(self._bands[priority])

    def top_priority(self) -> int | None:
        """The priority ``pop`` takes from next (None when empty)."""
        for priority in self._priorities:
            if self._bands[priority].count:
                return priority
        return None

    def band_counts(self) -> dict[int, int]:
        return {p: band.count for p, band in self._bands.items()}

    def flow_stats(self) -> list[FlowStats]:
        stats = []
        for priority in self._priorities:
            for key, flow in self._bands[priority].flows.items():
                oldest = min(item.arrival for _, item in flow.heap if item.queued)
                stats.append(FlowStats(key, flow.count, oldest))
        return stats
