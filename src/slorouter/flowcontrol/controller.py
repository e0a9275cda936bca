"""The flow controller: requests enter as tickets, wait in ``FlowQueues``, and leave with one outcome.

``submit`` queues a request and runs the pump at once, so a request that finds room goes through without
waiting (its ticket is DISPATCHED when ``submit`` returns). The pump releases queued requests while the
saturation detector reports room beyond the requests already released and not yet dispatched (their
*reservations*: the pick for a released request is made after it leaves the queue, on fresh load, and until
then the in-flight counts do not show it). ``release`` ends a reservation (the request is in the in-flight
counts now, or failed). Who calls ``service`` (expiry, eviction, the pump) and when: the Director after
every change of in-flight load; with an event loop, a pump task that lives while requests are queued and
wakes at the next deadline or every ``poll_interval_s`` (new scraped signals); in the discrete-event
benchmark, its event loop at ``next_wakeup``.

The priority lane (``lane_min_priority``; None: none): while requests wait, a queued request of at least that
priority is also released when the pool has only *lane* room (``SaturationDetector``: the looser prefill
bound, a higher KV bound), and every request of the lane released while others wait is a *lane* ticket,
whose pick the Director restricts to the endpoints with lane room (``LanePick``). At saturation the pool's
room opens in small steps that the bands share; the lane lets the top band take the endpoints that can
still serve it soon instead of waiting for a step of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from slorouter.clock import Clock
from slorouter.flowcontrol.metrics import FlowControlMetrics
from slorouter.flowcontrol.queue import FlowQueues
from slorouter.flowcontrol.saturation import SaturationDetector
from slorouter.flowcontrol.types import FlowKey, Outcome, QueuedRequest, Rejection
from slorouter.scheduling.types import InferenceRequest

log = logging.getLogger(__name__)


class LanePick(StrEnum):
    """Where a lane ticket goes: the scheduler's pick among the endpoints with lane room, or the least
    loaded of them (fewest requests in flight, then fewest uncached prompt tokens)."""

    SCHEDULER = "scheduler"
    LEAST_LOADED = "least-loaded"


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's passage through flow control. ``outcome`` None: still queued (or rejected, with
    ``rejection`` set); ``reason`` says which rule decided a dispatch, an eviction or a rejection;
    ``lane``: released by the priority lane or in it while others waited (its pick is restricted)."""

    item: QueuedRequest
    on_outcome: Callable[[Ticket], None] | None = None
    outcome: Outcome | None = None
    rejection: Rejection | None = None
    reason: str = ""
    left_at: float | None = None
    reserved: bool = field(default=False)
    lane: bool = False

    @property
    def queued_s(self) -> float:
        return 0.0 if self.left_at is None else max(0.0, self.left_at - self.item.arrival)


class FlowController:
    def __init__(
        self,
        queues: FlowQueues,
        detector: SaturationDetector,
        clock: Clock,
        *,
        poll_interval_s: float = 0.02,
        request_ttl_s: float | None = None,
        fairness_header: str = "x-llm-d-inference-fairness-id",
        metrics: FlowControlMetrics | None = None,
        lane_min_priority: int | None = None,
        lane_pick: LanePick = LanePick.SCHEDULER,
    ) -> None:
        self.queues = queues
        self.lane_min_priority = lane_min_priority
        self.lane_pick = lane_pick
        self.request_ttl_s = request_ttl_s
        self.fairness_header = fairness_header
        self.detector = detector
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.metrics = metrics
        self.reserved = 0
        self._tickets: dict[int, Ticket] = {}  # id(item) -> its ticket, while queued
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        if metrics is not None:
            metrics.watch(queues, detector, clock)

    def __len__(self) -> int:
        return len(self.queues)

    def queued_request(self, request: InferenceRequest) -> QueuedRequest:
        """A request as flow control sees it: its flow (fairness header, priority), its SLO deadline
        (received + TTFT SLO), its TTL from now; its size is its prompt's, its cost its prompt tokens."""
        now = self.clock.now()
        slo = request.slo_ttft_ms
        return QueuedRequest(
            request.request_id,
            FlowKey(request.headers.get(self.fairness_header, ""), request.priority),
            now,
            size_bytes=len(request.prompt_text),
            cost_tokens=request.prompt_tokens,
            sheddable=request.sheddable,
            slo_deadline=None if slo is None else request.received_at + slo / 1000.0,
            ttl_deadline=None if self.request_ttl_s is None else now + self.request_ttl_s,
        )

    def submit(self, item: QueuedRequest, on_outcome: Callable[[Ticket], None] | None = None) -> Ticket:
        """Queue a request and pump. The ticket is DISPATCHED at once when there was room, rejected (its
        ``rejection`` set, HTTP 429) when a limit left no place for it, else queued."""
        ticket = Ticket(item, on_outcome)
        self.service()  # what is due goes first: expired requests do not count against the limits
        result = self.queues.add(item)
        if result.rejection is not None:
            ticket.rejection = result.rejection
            ticket.reason = result.rejection.limit
            ticket.left_at = self.clock.now()
            self._count(ticket, "rejected")
            return ticket
        self._tickets[id(item)] = ticket
        for victim in result.evicted:
            self._finish(victim, Outcome.EVICTED, "room")
        # Pump before the deadlines: a request that finds room goes on to scheduling even if its SLO is out
        # of reach already (the admitters judge that, with predictions); only waiting makes it miss.
        self._pump(self.clock.now(), newcomer=True)
        return ticket

    def cancel(self, ticket: Ticket) -> bool:
        """The client went away: out of the queue at once (False if it had left already)."""
        if ticket.outcome is None and ticket.rejection is None and self.queues.remove(ticket.item):
            self._finish(ticket.item, Outcome.CANCELLED, "client")
            return True
        self.release(ticket)
        return False

    def release(self, ticket: Ticket) -> None:
        """End a dispatched ticket's reservation (it is counted in flight now, or it failed); idempotent.
        Less reserved load may mean room: the pump runs."""
        if ticket.reserved:
            ticket.reserved = False
            self.reserved -= 1
            self.service()

    def served(self, ticket: Ticket, tokens: float) -> None:
        """The reply's tokens, charged to the ticket's flow (least attained service)."""
        self.queues.served(ticket.item.flow, tokens, self.clock.now())

    def service(self) -> None:
        """Expire and evict what is due, then dispatch while the pool has room."""
        now = self.clock.now()
        queues = self.queues
        for item, outcome in queues.due(now):
            self._finish(item, outcome, "ttl" if outcome is Outcome.EXPIRED else "slo")
        self._pump(now)

    def _pump(self, now: float, newcomer: bool = False) -> None:
        """Release while there is room, then, while the top band queued is the lane's, while there is lane
        room. Contended (the detector's tighter bound) when a request other than the ``newcomer`` submitted
        just now waits."""
        queues = self.queues
        queued = len(queues)
        if not queued:
            return
        contended = queued > (1 if newcomer else 0)
        room = self.detector.room(contended=contended) - self.reserved
        while room >= 1:
            released = queues.pop(now)
            if released is None:
                break
            self._finish(released, Outcome.DISPATCHED, "room", contended and self._in_lane(released.priority))
            room -= 1
        if not self._in_lane(queues.top_priority()):
            return
        room = self.detector.room(contended=True, lane=True) - self.reserved
        while room >= 1 and self._in_lane(queues.top_priority()):
            released = queues.pop(now)
            assert released is not None
            self._finish(released, Outcome.DISPATCHED, "lane", True)
            room -= 1

    def _in_lane(self, priority: int | None) -> bool:
        """Whether requests of ``priority`` (None: the queue is empty) are in the priority lane."""
        return (
            priority is not None and self.lane_min_priority is not None and priority >= self.lane_min_priority
        )

    def next_wakeup(self) -> float | None:
        """When ``service`` has timed work next (a TTL or SLO deadline); None: nothing queued with one."""
        return self.queues.next_deadline()

    # --- with an event loop ---------------------------------------------------------------------------
    def ensure_pump(self) -> None:
        """Start the pump task if requests are queued and it is not running (needs a running loop)."""
        if len(self.queues) and (self._task is None or self._task.done()):
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._pump_loop(), name="flow-control pump")

    async def _pump_loop(self) -> None:
        try:
            while len(self.queues):
                now = self.clock.now()
                wait = self.poll_interval_s
                deadline = self.next_wakeup()
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - now))
                await asyncio.sleep(wait)
                self.service()
        except Exception:  # pragma: no cover - a bug; the waiters still time out by their TTL
            log.exception("flow-control pump failed")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- internals ------------------------------------------------------------------------------------
    def _finish(self, item: QueuedRequest, outcome: Outcome, reason: str, lane: bool = False) -> None:
        ticket = self._tickets.pop(id(item))
        ticket.outcome = outcome
        ticket.reason = reason
        ticket.lane = lane
        ticket.left_at = self.clock.now()
        if outcome is Outcome.DISPATCHED:
            ticket.reserved = True
            self.reserved += 1
        self._count(ticket, str(outcome))
        if ticket.on_outcome is not None:
            try:
                ticket.on_outcome(ticket)
            except Exception:
                log.exception("flow-control outcome callback failed")

    def _count(self, ticket: Ticket, outcome: str) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        priority = str(ticket.item.priority)
        metrics.outcomes.labels(priority, outcome, ticket.reason).inc()
        if outcome != "rejected":
            metrics.queued_seconds.labels(priority, outcome).observe(ticket.queued_s)
