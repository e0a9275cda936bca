"""Fairness across the flows of a band, and ordering inside a flow.

Fairness: ``round-robin`` serves the backlogged flows of a band in turn, one request each; over any window
in which two flows stay backlogged, their dispatch counts differ by at most one. ``program-aware-fairness``
(the original's name) serves the flow with the least attained service: tokens served to it, decayed with a
half-life, so a tenant sending long prompts gets its share of tokens, not of requests.

Ordering: ``fcfs`` (arrival order) or ``slo-deadline`` (earliest arrival + TTFT SLO first; requests without
an SLO after those with one, in arrival order).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection
from typing import Protocol

from slorouter.flowcontrol.types import FlowKey, QueuedRequest

ORDERING_POLICIES = ("fcfs", "slo-deadline")
FAIRNESS_POLICIES = ("round-robin", "program-aware-fairness")


def ordering_key(policy: str) -> Callable[[QueuedRequest], tuple[float, int]]:
    if policy == "fcfs":
        return lambda item: (item.arrival, item.seq)
    if policy == "slo-deadline":
        return lambda item: (item.edf_key, item.seq)
    raise ValueError(f"unknown ordering policy {policy!r}: use one of {', '.join(ORDERING_POLICIES)}")


class FairnessPolicy(Protocol):
    def pick(self, backlogged: Collection[FlowKey], now: float) -> FlowKey:
        """The flow to serve next among the backlogged flows of one band (not empty)."""
        ...

    def served(self, flow: FlowKey, tokens: float, now: float) -> None:
        """``tokens`` were served to ``flow`` (dispatch, and later the reply's tokens)."""
        ...


class RoundRobin:
    """Each backlogged flow in turn; a flow that becomes backlogged joins at the end of the turn."""

    __slots__ = ("_ring",)

    def __init__(self) -> None:
        self._ring: deque[FlowKey] = deque()

    def pick(self, backlogged: Collection[FlowKey], now: float) -> FlowKey:
        ring = self._ring
        for flow in backlogged:
            if flow not in ring:
                ring.append(flow)
        while ring:
            flow = ring.popleft()
            if flow in backlogged:
                ring.append(flow)
                return flow
        raise ValueError("no backlogged flow")

    def served(self, flow: FlowKey, tokens: float, now: float) -> None:
        pass


class LeastAttainedService:
    """The flow with the fewest decayed served tokens; ties by flow key (deterministic)."""

    __slots__ = ("_half_life_s", "_served")

    def __init__(self, half_life_s: float) -> None:
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0 (got {half_life_s})")
        self._half_life_s = half_life_s
        self._served: dict[FlowKey, tuple[float, float]] = {}  # flow -> (tokens, as of)

    def attained(self, flow: FlowKey, now: float) -> float:
        tokens, at = self._served.get(flow, (0.0, now))
        return tokens * math.exp2(-max(0.0, now - at) / self._half_life_s)

    def pick(self, backlogged: Collection[FlowKey], now: float) -> FlowKey:
        return min(backlogged, key=lambda flow: (self.attained(flow, now), flow))

    def served(self, flow: FlowKey, tokens: float, now: float) -> None:
        self._served[flow] = (self.attained(flow, now) + tokens, now)
        if len(self._served) > 4096:  # forget flows whose service has decayed away
            self._served = {f: v for f, v in self._served.items() if self.attained(f, now) >= 1.0}


def fairness_policy(name: str, half_life_s: float = 60.0) -> FairnessPolicy:
    if name == "round-robin":
        return RoundRobin()
    if name == "program-aware-fairness":
        return LeastAttainedService(half_life_s)
    raise ValueError(f"unknown fairness policy {name!r}: use one of {', '.join(FAIRNESS_POLICIES)}")
