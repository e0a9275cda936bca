"""How many more requests the pool can take now: the gate of the dispatch pump.

Per healthy endpoint, from the router's own fresh in-flight counts and the scraped engine signals:

- its KV cache at or above ``kv_cache_util_threshold`` (scraped): full;
- at its prefill bound of uncached prompt tokens in flight (fresh): full. The bound is
  ``max_inflight_prefill_tokens`` if set, else derived from the pool: the endpoint's learned prefill rate
  (``PrefillRates``) × a time, the prefill backlog it clears in that time; no bound while the rate is not
  learned yet, or with the time None. The time is ``prefill_target_s`` when nothing waits in the router and
  ``queued_prefill_target_s`` (shorter) while requests wait (*contended*): then the router's order, not the
  engines' queues, should decide who goes next, so the engines are kept to about one step of prefill;
  below saturation nothing waits and the looser bound leaves dispatch as it is without flow control. Under
  a prefill bound an endpoint takes at most one request per pump: the next is released once the previous
  one is counted in flight, so a queue drains on fresh counts instead of all at once;
- otherwise it has room for ``limit − in-flight requests`` more, where ``limit`` is
  ``max_inflight_requests`` if set, else derived from the pool: the endpoint's batch-slot cap (learned once
  its engine made requests wait: the most requests it was seen running since, see ``learn``) plus the
  requests it may hold waiting in its engine: ``queue_depth_threshold``, and ``queued_queue_depth_threshold``
  (smaller) while requests wait in the router. An engine queues FCFS, so a request the router released by
  priority would wait behind every request already waiting there for a batch slot; while the router holds
  requests, it keeps the engines' queues short and its own order decides. The one request above the cap
  is what lets a cap learned low grow. An endpoint whose cap is not known yet (it never queued) is
  unbounded unless its scraped engine queue has reached that depth (at least 1).

The pool's room is the sum. Requests the pump released and the front-end has not dispatched yet are counted
by the controller, not here.

*Lane* room is the room of the priority lane (``FlowController``): the same rules with the looser prefill
bound (``prefill_target_s`` even while requests wait) and ``lane_kv_cache_util_threshold`` in place of
``kv_cache_util_threshold``. It lets a request of high priority go on, to an endpoint that has it, while the
pool is too full for the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from slorouter.flowcontrol.prefill import PrefillRates
from slorouter.pool.state import PoolState


@dataclass(frozen=True, slots=True)
class SaturationThresholds:
    queue_depth_threshold: int = 5
    kv_cache_util_threshold: float = 0.8
    max_inflight_requests: int | None = None  # per endpoint; None: learned cap + queue_depth_threshold
    max_inflight_prefill_tokens: int | None = None  # per endpoint; None: learned rate × prefill_target_s
    prefill_target_s: float | None = 0.1  # the derived prefill bound's time; None: no derived bound
    # Its time while requests wait in the router; None: prefill_target_s.
    queued_prefill_target_s: float | None = 0.02
    lane_kv_cache_util_threshold: float = 0.9  # the KV bound of lane room
    # The engine queue an endpoint may hold while requests wait in the router; None: queue_depth_threshold.
    queued_queue_depth_threshold: int | None = 1

    def __post_init__(self) -> None:
        for name in ("prefill_target_s", "queued_prefill_target_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 (or None)")
        for name in ("queue_depth_threshold", "queued_queue_depth_threshold"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("kv_cache_util_threshold", "lane_kv_cache_util_threshold"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1]")


class SaturationDetector:
    __slots__ = ("_caps", "pool", "prefill_rates", "thresholds")

    def __init__(
        self,
        pool: PoolState,
        thresholds: SaturationThresholds | None = None,
        prefill_rates: PrefillRates | None = None,
    ) -> None:
        self.pool = pool
        self.thresholds = thresholds or SaturationThresholds()
        self.prefill_rates = prefill_rates or PrefillRates()
        self._caps: dict[str, int] = {}  # address -> most requests seen running since it made some wait

    def observe_first_token(self, address: str, tokens_ahead: int, seconds: float) -> None:
        """A request's first token: ``tokens_ahead`` uncached tokens were in flight on ``address`` when it
        was dispatched, ``seconds`` ago (a sample of the endpoint's prefill rate)."""
        self.prefill_rates.observe(address, tokens_ahead, seconds)

    def prefill_bound(self, address: str, contended: bool = False) -> float | None:
        """The endpoint's bound on uncached prompt tokens in flight (None: none applies); ``contended``:
        requests wait in the router."""
        t = self.thresholds
        if t.max_inflight_prefill_tokens is not None:
            return float(t.max_inflight_prefill_tokens)
        if t.prefill_target_s is None:
            return None
        target = t.prefill_target_s
        if contended and t.queued_prefill_target_s is not None:
            target = t.queued_prefill_target_s
        rate = self.prefill_rates.rate(address)
        return None if rate is None else rate * target

    def learn(self) -> None:
        """Read the latest scrape into the learned batch-slot caps (cheap; called before each decision).

        An endpoint's cap is first learned when its engine makes requests wait, and from then on it is the
        most requests it was seen running: requests also wait on a prefill token budget or on KV blocks,
        well below the slot cap, and a cap learned there must grow once the engine runs more (the slot
        room of ``queue_depth_threshold`` above the cap lets it)."""
        pool = self.pool
        columns = pool.columns
        waiting = columns["waiting"]
        running = columns["running"]
        caps = self._caps
        for position, endpoint in enumerate(pool.endpoints):
            known = caps.get(endpoint.address)
            if known is None and not waiting[position] > 0:
                continue
            seen = int(running[position])
            if known is None or seen > known:
                caps[endpoint.address] = seen

    def cap(self, address: str) -> int | None:
        return self._caps.get(address)

    def room(self, contended: bool = False, lane: bool = False) -> float:
        """More requests the pool can take now (``math.inf``: no bound applies); ``contended``: requests
        wait in the router; ``lane``: the priority lane's room."""
        self.learn()
        return sum(self._endpoint_room(p, contended, lane) for p in self.pool.healthy_positions().tolist())

    def lane_mask(self, positions: np.ndarray) -> np.ndarray:
        """Which of the endpoints at pool ``positions`` have lane room (a boolean array aligned with them)."""
        self.learn()
        return np.fromiter(
            (self._endpoint_room(p, True, True) > 0 for p in positions.tolist()),
            dtype=bool,
            count=len(positions),
        )

    def saturation(self, contended: bool = False) -> float:
        """The share of healthy endpoints without room (1.0 when none is healthy)."""
        healthy = self.pool.healthy_positions()
        if not len(healthy):
            return 1.0
        full = 0
        for position in healthy.tolist():
            if self._endpoint_room(position, contended) <= 0:
                full += 1
        return full / len(healthy)

    def _endpoint_room(self, position: int, contended: bool, lane: bool = False) -> float:
        pool = self.pool
        t = self.thresholds
        columns = pool.columns
        kv_threshold = t.lane_kv_cache_util_threshold if lane else t.kv_cache_util_threshold
        if columns["kv_usage"][position] >= kv_threshold:
            return 0.0
        address = pool.endpoints[position].address
        bound = self.prefill_bound(address, contended and not lane)
        if bound is not None and columns["inflight_prefill_tokens"][position] >= bound:
            return 0.0
        room = self._slot_room(position, address, contended)
        return room if bound is None else min(room, 1.0)

    def queue_depth(self, contended: bool = False) -> int:
        """The engine queue an endpoint may hold beyond its batch-slot cap."""
        t = self.thresholds
        if contended and t.queued_queue_depth_threshold is not None:
            return t.queued_queue_depth_threshold
        return t.queue_depth_threshold

    def _slot_room(self, position: int, address: str, contended: bool) -> float:
        t = self.thresholds
        columns = self.pool.columns
        if t.max_inflight_requests is not None:
            return max(0.0, t.max_inflight_requests - float(columns["inflight_requests"][position]))
        depth = self.queue_depth(contended)
        cap = self._caps.get(address)
        if cap is None:
            return 0.0 if columns["waiting"][position] >= max(1, depth) else math.inf
        return max(0.0, cap + depth - float(columns["inflight_requests"][position]))
