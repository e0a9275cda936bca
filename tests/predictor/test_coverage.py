"""CoverageTracker: online quantile tracking of the served predictions' live coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slorouter.predictor.coverage import CoverageTracker


def test_a_miss_raises_the_factor_and_a_covered_outcome_lowers_it():
    tracker = CoverageTracker(0.9, step=0.01)
    assert tracker.factor("ttft") == 1.0
    assert tracker.observe("ttft", actual_ms=120.0, served_ms=100.0)  # a miss: + step × 0.9
    assert tracker.factor("ttft") == pytest.approx(math.exp(0.009))
    assert tracker.observe("ttft", actual_ms=80.0, served_ms=100.0)  # covered: − step × 0.1
    assert tracker.factor("ttft") == pytest.approx(math.exp(0.008))
    assert tracker.factor("tpot") == 1.0  # per kind
    assert tracker.outcomes["ttft"] == 2 and tracker.misses["ttft"] == 1


def test_nine_covered_outcomes_balance_one_miss_at_p90():
    tracker = CoverageTracker(0.9, step=0.05)
    tracker.observe("tpot", 2.0, 1.0)
    for _ in range(9):
        tracker.observe("tpot", 0.5, 1.0)
    assert tracker.factor("tpot") == pytest.approx(1.0)


@pytest.mark.parametrize(
    "actual, served", [(0.0, 10.0), (10.0, 0.0), (-1.0, 10.0), (math.nan, 10.0), (10.0, math.inf)]
)
def test_outcomes_that_are_not_positive_finite_latencies_teach_nothing(actual, served):
    tracker = CoverageTracker()
    assert not tracker.observe("ttft", actual, served)
    assert tracker.factor("ttft") == 1.0 and tracker.outcomes["ttft"] == 0


def test_the_factor_is_bounded():
    tracker = CoverageTracker(0.9, step=0.5, max_log_factor=math.log(2.0))
    for _ in range(100):
        tracker.observe("ttft", 1e6, 1.0)
    assert tracker.factor("ttft") == pytest.approx(2.0)
    for _ in range(1000):
        tracker.observe("ttft", 1e-6, 1.0)
    assert tracker.factor("ttft") == pytest.approx(0.5)


@pytest.mark.parametrize(
    "kwargs",
    [{"quantile": 0.0}, {"quantile": 1.0}, {"step": 0.0}, {"step": math.inf}, {"max_log_factor": 0.0}],
)
def test_invalid_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        CoverageTracker(**kwargs)


def test_unknown_model_kinds_are_refused():
    with pytest.raises(ValueError):
        CoverageTracker().observe("e2e", 1.0, 1.0)  # type: ignore[arg-type]


def test_a_model_that_under_covers_is_brought_to_its_quantile():
    """Served 'p90' that is really the p75 of lognormal latencies whose level also drifts 2x mid-way."""
    rng = np.random.default_rng(0)
    tracker = CoverageTracker(0.9, step=0.01)
    sigma = 0.5
    covered = []
    for t in range(20_000):
        level = 100.0 if t < 10_000 else 200.0  # the model does not see the drift
        actual = level * math.exp(sigma * rng.standard_normal())
        model_p90 = 100.0 * math.exp(sigma * 0.674)  # the p75 at the first level
        served = model_p90 * tracker.factor("tpot")
        covered.append(actual <= served)
        tracker.observe("tpot", actual, served)
    for half in (covered[2_000:10_000], covered[12_000:]):
        assert np.mean(half) == pytest.approx(0.9, abs=0.015)


@settings(max_examples=60, deadline=None)
@given(
    quantile=st.sampled_from([0.5, 0.8, 0.9, 0.95]),
    step=st.floats(0.005, 0.2),
    ratios=st.lists(st.floats(0.3, 3.0, allow_nan=False), min_size=1, max_size=400),
)
def test_the_long_run_miss_rate_is_within_the_bound_for_any_sequence(quantile, step, ratios):
    """Whatever the outcomes (actual = ratio × the model's prediction, in any order), while the model is
    within the factor's bounds of the truth the miss rate over T outcomes is within (B + step) / (step·T)
    of 1 − quantile, B the bound on the log-factor: the factor's moves add up to
    step × (misses − T·(1 − q))."""
    tracker = CoverageTracker(quantile, step=step)
    misses = 0
    for ratio in ratios:
        served = 100.0 * tracker.factor("ttft")
        misses += 100.0 * ratio > served
        tracker.observe("ttft", 100.0 * ratio, served)
    n = len(ratios)
    bound = (tracker.max_log_factor + step) / (step * n)
    assert abs(misses / n - (1 - quantile)) <= bound + 1e-9
