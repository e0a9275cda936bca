"""``slorouter top``'s tuning line."""

from __future__ import annotations

from slorouter.serving.status import TuningStatus
from slorouter.top.view import tuning_summary


def test_the_tuning_line_says_what_routes_the_last_verdict_and_the_twins_error():
    status = TuningStatus(
        active="token-aware",
        candidates=["predicted-latency", "token-aware"],
        rounds=4,
        switches=1,
        worker="running",
        last_round={"reason": "active is best", "twin_error": 0.084},
    )
    assert (
        tuning_summary(status)
        == "token-aware · 1 switches in 4 rounds · last: active is best (twin error 8%)"
    )


def test_a_tuner_that_is_down_says_why():
    status = TuningStatus(active="a", candidates=["a"], rounds=1, switches=0, worker="down: EOFError: ended")
    assert tuning_summary(status) == "a · 0 switches in 1 rounds · tuner down: EOFError: ended"
