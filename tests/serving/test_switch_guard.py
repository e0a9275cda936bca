"""The switch guard: an automatic switch that collapses TTFT is undone at once."""

from __future__ import annotations

import pytest

from slorouter.serving.switch_guard import SwitchGuard, ttft_p90_ms
from slorouter.serving.traffic_window import WindowEntry


def entries(start, end, ttft_ms, per_s=10):
    out = []
    for k in range(int((end - start) * per_s)):
        out.append(
            WindowEntry(
                start + k / per_s,
                100,
                10,
                10,
                (),
                True,
                None,
                None,
                0,
                200,
                "a",
                "p",
                ttft_ms,
                10.0,
                0.0,
                1.0,
            )
        )
    return out


def test_a_collapse_after_the_switch_goes_back_to_the_previous_candidate():
    guard = SwitchGuard(period_s=10.0, watch_s=60.0, ratio=1.5)
    before = entries(0.0, 30.0, 100.0)
    guard.switched(before, at=30.0, previous="predicted-latency")
    assert guard.watch is not None and guard.watch.before_p90_ms == 100.0
    fine = before + entries(30.0, 40.0, 140.0)
    assert guard.check(fine, 40.0) is None
    collapsed = fine + entries(40.0, 50.0, 160.0)
    assert guard.check(collapsed, 50.0) == "predicted-latency"
    assert guard.watch is None and guard.check(collapsed, 60.0) is None


def test_the_watch_ends_after_watch_s():
    guard = SwitchGuard(period_s=10.0, watch_s=20.0)
    history = entries(0.0, 30.0, 100.0)
    guard.switched(history, at=30.0, previous="x")
    late = history + entries(30.0, 60.0, 1000.0)
    assert guard.check(late, 51.0) is None and guard.watch is None


def test_no_watch_without_enough_requests_before_the_switch():
    guard = SwitchGuard(min_requests=20)
    guard.switched(entries(0.0, 1.0, 100.0), at=30.0, previous="x")
    assert guard.watch is None


def test_failed_requests_count_as_infinitely_slow():
    failed = entries(0.0, 10.0, None)
    assert ttft_p90_ms(failed + entries(0.0, 10.0, 5.0), 0.0, 10.0, 1) == float("inf")
    assert ttft_p90_ms(entries(0.0, 1.0, 5.0), 0.0, 10.0, 20) != ttft_p90_ms(
        entries(0.0, 1.0, 5.0), 0.0, 10.0, 20
    )


@pytest.mark.parametrize(
    "kwargs", [{"period_s": 0.0}, {"watch_s": 5.0, "period_s": 10.0}, {"ratio": 1.0}, {"min_requests": 0}]
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="need period_s"):
        SwitchGuard(**kwargs)
