"""The switch guard: an automatic switch that collapses TTFT is undone at once."""

from __future__ import annotations

import math

import pytest

from slorouter.serving.switch_guard import SwitchGuard, ttft_p90_ms
from slorouter.serving.traffic_window import TrafficWindow


def traffic(window: TrafficWindow, start: float, end: float, ttft_ms: float | None, per_s: int = 10) -> None:
    """Requests picked from ``start`` to ``end``, each with that TTFT (None: no first token yet)."""
    for k in range(int((end - start) * per_s)):
        arrival = start + k / per_s
        window.picked(arrival)
        if ttft_ms is not None:
            window.first_token(arrival, ttft_ms)


def test_a_collapse_after_the_switch_goes_back_to_the_previous_candidate():
    window = TrafficWindow()
    guard = SwitchGuard(period_s=10.0, watch_s=60.0, ratio=1.5)
    traffic(window, 0.0, 30.0, 100.0)
    guard.switched(at=30.0, previous="predicted-latency")
    traffic(window, 30.0, 40.0, 140.0)
    assert guard.check(window, 35.0) is None  # nothing judged before a period has passed
    assert guard.check(window, 50.0) is None  # [30, 40): 1.4x
    assert guard.watch is not None and guard.watch.before_p90_ms == 100.0
    traffic(window, 40.0, 50.0, 160.0)
    assert guard.check(window, 60.0) == "predicted-latency"  # [40, 50): 1.6x
    assert guard.watch is None and guard.check(window, 70.0) is None


def test_requests_still_without_a_first_token_count_as_infinitely_slow():
    window = TrafficWindow()
    guard = SwitchGuard(period_s=10.0)
    traffic(window, 0.0, 30.0, 100.0)
    guard.switched(at=30.0, previous="a")
    traffic(window, 30.0, 40.0, None)  # a stalled pod: picked, no first token by 50 s
    assert guard.check(window, 50.0) == "a"


def test_the_watch_ends_after_watch_s():
    window = TrafficWindow()
    guard = SwitchGuard(period_s=10.0, watch_s=20.0)
    traffic(window, 0.0, 30.0, 100.0)
    guard.switched(at=30.0, previous="x")
    traffic(window, 30.0, 70.0, 100.0)
    assert guard.check(window, 61.0) is None and guard.watch is None


def test_no_watch_without_enough_requests_before_the_switch():
    window = TrafficWindow()
    guard = SwitchGuard(min_requests=20)
    traffic(window, 29.0, 30.0, 100.0)
    guard.switched(at=30.0, previous="x")
    traffic(window, 30.0, 50.0, 1000.0)
    assert guard.check(window, 45.0) is None and guard.watch is None


def test_the_p90_pads_missing_first_tokens_and_needs_enough_requests():
    window = TrafficWindow()
    traffic(window, 0.0, 10.0, 5.0)
    traffic(window, 0.0, 2.0, None)
    assert ttft_p90_ms(window, 0.0, 10.0, 1) == math.inf  # 20 of 120 without a first token
    assert math.isnan(ttft_p90_ms(window, 0.0, 1.0, 50))


@pytest.mark.parametrize(
    "kwargs", [{"period_s": 0.0}, {"watch_s": 5.0, "period_s": 10.0}, {"ratio": 1.0}, {"min_requests": 0}]
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="need period_s"):
        SwitchGuard(**kwargs)
