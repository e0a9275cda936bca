"""The circuit breaker of ``PredictionClient``: stop calling prediction servers that keep failing or are slow.

Closed, every call goes through; each exchange with the servers is recorded. The breaker opens after
``failures`` consecutive failed exchanges, or when the p99 latency of the last ``window`` exchanges (a
timed-out one counts as slower than any budget) is above ``latency_budget_s``. Open, calls are refused at
once (the router routes them by its fallback, adding no latency) until ``cooldown_s`` has passed; then it
is half-open and lets one call through as a probe. The probe answered within the budget closes it; a probe
that fails or is slow opens it again for twice the cool-down (at most ``max_cooldown_s``).

Results are tagged with the breaker's epoch when their call was admitted, so an exchange that started
before a transition cannot move the breaker after it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failures: int = 5  # consecutive failed exchanges that open it
    latency_budget_s: float = 0.05  # p99 above this opens it
    window: int = 100  # exchanges the p99 is taken over
    min_exchanges: int = 20  # no p99 verdict on fewer
    cooldown_s: float = 1.0
    max_cooldown_s: float = 10.0
    probe_timeout_s: float = 1.0  # a probe with no result after this is given up, and another admitted

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError(f"failures must be at least 1, got {self.failures}")
        if not self.latency_budget_s > 0:
            raise ValueError(f"latency_budget_s must be positive, got {self.latency_budget_s}")
        if not 1 <= self.min_exchanges <= self.window:
            raise ValueError(f"min_exchanges must be in 1..window ({self.window}), got {self.min_exchanges}")
        if not 0 < self.cooldown_s <= self.max_cooldown_s:
            raise ValueError(
                f"cooldown_s must be positive and at most max_cooldown_s ({self.max_cooldown_s}), "
                f"got {self.cooldown_s}"
            )
        if not self.probe_timeout_s > 0:
            raise ValueError(f"probe_timeout_s must be positive, got {self.probe_timeout_s}")


class CircuitBreaker:
    """Closed → open → half-open → closed (or open again), on the results it is given."""

    def __init__(
        self,
        config: BreakerConfig,
        clock: Callable[[], float],
        on_transition: Callable[[BreakerState, BreakerState, str], None] | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._on_transition = on_transition
        self.state = BreakerState.CLOSED
        self.epoch = 0
        self.last_reason: str | None = None  # why it last opened
        self._consecutive = 0
        self._latencies: deque[float] = deque(maxlen=config.window)
        self._slow = 0  # how many of _latencies are above the budget
        self._cooldown_s = config.cooldown_s
        self._reopen_at = 0.0
        self._probe_deadline: float | None = None

    def admit(self) -> int | None:
        """The epoch to tag the call's result with, or None: the call must not be made."""
        if self.state is BreakerState.CLOSED:
            return self.epoch
        now = self._clock()
        if self.state is BreakerState.OPEN:
            if now < self._reopen_at:
                return None
            self._move(BreakerState.HALF_OPEN, "cool-down over")
        elif self._probe_deadline is not None and now < self._probe_deadline:
            return None  # the probe is in flight
        self._probe_deadline = now + self.config.probe_timeout_s
        return self.epoch

    def release(self, epoch: int) -> None:
        """The call admitted at ``epoch`` was not made (no server was ready): a half-open breaker admits
        the next call as its probe instead."""
        if epoch == self.epoch and self.state is BreakerState.HALF_OPEN:
            self._probe_deadline = None

    def record(self, epoch: int, ok: bool, latency_s: float | None = None) -> None:
        """The result of an exchange admitted at ``epoch``. ``latency_s`` is None for a failure that says
        nothing about speed (a refused connection, an error answer)."""
        if epoch != self.epoch:
            return
        budget = self.config.latency_budget_s
        if self.state is BreakerState.HALF_OPEN:
            if ok and latency_s is not None and latency_s <= budget:
                self._cooldown_s = self.config.cooldown_s
                self._move(BreakerState.CLOSED, "the probe succeeded")
            else:
                self._cooldown_s = min(2 * self._cooldown_s, self.config.max_cooldown_s)
                self._open("the probe failed" if not ok else "the probe was slower than the budget")
            return
        if latency_s is not None:
            if len(self._latencies) == self._latencies.maxlen and self._latencies[0] > budget:
                self._slow -= 1
            self._latencies.append(latency_s)
            self._slow += latency_s > budget
        self._consecutive = 0 if ok else self._consecutive + 1
        if self._consecutive >= self.config.failures:
            self._open(f"{self._consecutive} consecutive failures")
        elif self._p99_over_budget():
            self._open(f"p99 latency above {budget * 1000:g} ms over the last {len(self._latencies)} calls")

    def _p99_over_budget(self) -> bool:
        n = len(self._latencies)
        if n < self.config.min_exchanges:
            return False
        # The nearest-rank p99 is the ceil(0.99 n)-th smallest: above the budget when more than
        # n - ceil(0.99 n) exchanges are.
        return self._slow > n - math.ceil(0.99 * n)

    def _open(self, reason: str) -> None:
        self.last_reason = reason
        self._reopen_at = self._clock() + self._cooldown_s
        self._move(BreakerState.OPEN, reason)

    def _move(self, state: BreakerState, reason: str) -> None:
        old, self.state = self.state, state
        self.epoch += 1
        self._consecutive = 0
        self._latencies.clear()
        self._slow = 0
        self._probe_deadline = None
        if self._on_transition is not None:
            self._on_transition(old, state, reason)
