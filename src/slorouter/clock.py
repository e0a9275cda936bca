"""Injected time sources.

Everything that schedules or accounts (scheduler, plugins, pool state, predictor) takes a ``Clock`` instead
of calling ``time`` directly, so the same code runs in real time behind the gateway and in virtual time in the
discrete-event benchmark.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic time line (the origin is arbitrary)."""
        ...


class MonotonicClock:
    """Real time: ``time.monotonic``."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class WallClock:
    """Unix time: ``time.time``. Not monotonic: only for comparing with times other processes wrote (the
    age of saved state)."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()


class ManualClock:
    """Virtual time that only moves when told to (tests and the discrete-event simulator)."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds})")
        self._now += seconds

    def set(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"cannot move a clock backwards ({now} < {self._now})")
        self._now = now
