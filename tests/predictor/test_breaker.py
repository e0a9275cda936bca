"""The prediction client's circuit breaker, on a hand-moved clock."""

from __future__ import annotations

import math

import pytest

from slorouter.predictor.breaker import BreakerConfig, BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(**config: float) -> tuple[CircuitBreaker, Clock, list[tuple[str, str]]]:
    clock = Clock()
    moves: list[tuple[str, str]] = []
    options = {"failures": 3, "latency_budget_s": 0.05, "cooldown_s": 1.0, "max_cooldown_s": 4.0, **config}
    b = CircuitBreaker(BreakerConfig(**options), clock, lambda old, new, _: moves.append((old, new)))  # type: ignore[arg-type]
    return b, clock, moves


def fail(b: CircuitBreaker, n: int) -> None:
    for _ in range(n):
        epoch = b.admit()
        assert epoch is not None
        b.record(epoch, False)


def test_consecutive_failures_open_it_and_a_success_resets_the_count() -> None:
    b, _, moves = breaker()
    fail(b, 2)
    epoch = b.admit()
    assert epoch is not None
    b.record(epoch, True, 0.001)
    fail(b, 2)
    assert b.state is BreakerState.CLOSED
    fail(b, 1)
    assert b.state is BreakerState.OPEN and moves == [("closed", "open")]
    assert b.last_reason == "3 consecutive failures"
    assert b.admit() is None  # open: no call


def test_half_open_admits_one_probe_whose_success_closes_it() -> None:
    b, clock, moves = breaker()
    fail(b, 3)
    clock.now += 0.999
    assert b.admit() is None
    clock.now += 0.002
    probe = b.admit()
    assert probe is not None and b.state is BreakerState.HALF_OPEN
    assert b.admit() is None  # the probe is in flight: nobody else
    b.record(probe, True, 0.01)
    assert b.state is BreakerState.CLOSED
    assert moves == [("closed", "open"), ("open", "half-open"), ("half-open", "closed")]
    assert b.admit() is not None


def test_a_failed_or_slow_probe_reopens_with_a_doubled_cool_down_up_to_the_maximum() -> None:
    b, clock, _ = breaker()
    fail(b, 3)
    cooldowns = []
    for slow in (False, True, False, False):
        opened = clock.now
        while b.admit() is None:
            clock.now += 0.25
        cooldowns.append(clock.now - opened)
        epoch = b.epoch
        b.record(epoch, slow, 0.2 if slow else None)  # a slow success is a failed probe too
        assert b.state is BreakerState.OPEN
    assert cooldowns == [1.0, 2.0, 4.0, 4.0]
    while b.admit() is None:
        clock.now += 0.25
    b.record(b.epoch, True, 0.01)
    fail(b, 3)  # closed again: the cool-down is back to its start
    opened = clock.now
    while b.admit() is None:
        clock.now += 0.25
    assert clock.now - opened == 1.0


def test_p99_above_the_budget_opens_it() -> None:
    b, _, _ = breaker(failures=1000, window=100, min_exchanges=20)
    for _ in range(19):
        b.record(b.admit() or 0, True, 0.2)  # slow, but fewer than min_exchanges: no verdict yet
    assert b.state is BreakerState.CLOSED
    b.record(b.epoch, True, 0.2)
    assert b.state is BreakerState.OPEN and "p99" in (b.last_reason or "")


def test_p99_counts_the_slow_tail_over_the_window() -> None:
    b, _, _ = breaker(failures=1000, window=100, min_exchanges=100)
    for i in range(100):
        b.record(b.epoch, i != 50, math.inf if i == 50 else 0.001)  # 1 timeout in 100: p99 is fast
    assert b.state is BreakerState.CLOSED
    for _ in range(49):
        b.record(b.epoch, True, 0.001)  # the window slides; the timeout is still in it
    b.record(b.epoch, True, 0.06)  # a second slow one in the last 100: p99 above the budget
    assert b.state is BreakerState.OPEN


def test_old_results_do_not_move_it_and_a_released_probe_frees_the_slot() -> None:
    b, clock, _ = breaker()
    stale = b.admit()
    assert stale is not None
    fail(b, 3)
    b.record(stale, True, 0.001)  # admitted before it opened: ignored
    assert b.state is BreakerState.OPEN
    clock.now += 1.0
    probe = b.admit()
    assert probe is not None
    b.release(probe)  # not made (no server ready): the next call is the probe
    assert b.admit() == probe and b.state is BreakerState.HALF_OPEN
    clock.now += 1.0  # the probe's result never came: after probe_timeout_s another is admitted
    assert b.admit() == probe


def test_invalid_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="failures"):
        BreakerConfig(failures=0)
    with pytest.raises(ValueError, match="max_cooldown_s"):
        BreakerConfig(cooldown_s=5, max_cooldown_s=1)
    with pytest.raises(ValueError, match="min_exchanges"):
        BreakerConfig(window=10, min_exchanges=20)
    with pytest.raises(ValueError, match="latency_budget_s"):
        BreakerConfig(latency_budget_s=0)
