"""What flow control queues and what becomes of it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

QUEUED_HEADER = "x-slorouter-queued-ms"  # on responses: milliseconds the request waited in flow control


@dataclass(frozen=True, slots=True, order=True)
class FlowKey:
    """A flow: the requests of one fairness id (tenant) at one priority."""

    fairness_id: str
    priority: int


class Outcome(StrEnum):
    """How a queued request left the queue; each one leaves exactly once."""

    DISPATCHED = "dispatched"
    EVICTED = (
        "evicted"  # a sheddable request pushed out (429): its SLO became unreachable, or room was needed
    )
    EXPIRED = "expired"  # queued longer than the TTL (503)
    CANCELLED = "cancelled"  # the client went away


@dataclass(eq=False, slots=True)
class QueuedRequest:
    """One request while it waits. ``cost_tokens`` is what fairness charges its flow on dispatch.

    ``slo_deadline``: arrival + TTFT SLO (None: no SLO); ``ttl_deadline``: when it expires (None: never).
    ``seq`` is set by the queue (arrival order, ties broken by it)."""

    request_id: str
    flow: FlowKey
    arrival: float
    size_bytes: int = 0
    cost_tokens: int = 0
    sheddable: bool = False
    slo_deadline: float | None = None
    ttl_deadline: float | None = None
    seq: int = -1
    queued: bool = field(default=False, init=False)

    @property
    def priority(self) -> int:
        return self.flow.priority

    @property
    def edf_key(self) -> float:
        return math.inf if self.slo_deadline is None else self.slo_deadline


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was not queued (HTTP 429): which limit it hit."""

    limit: str  # "maxRequests", "maxBytes", "priorityBands[p].maxRequests", ...
    message: str


@dataclass(frozen=True, slots=True)
class AddResult:
    """``rejection`` is None when the request was queued; ``evicted`` the requests pushed out for it."""

    rejection: Rejection | None = None
    evicted: tuple[QueuedRequest, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.rejection is None


@dataclass(frozen=True, slots=True)
class Limits:
    """At most ``max_requests`` requests and ``max_bytes`` bytes queued (None: no bound)."""

    max_requests: int | None = None
    max_bytes: int | None = None
