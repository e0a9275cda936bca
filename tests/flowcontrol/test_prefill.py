"""The derived prefill bound: each endpoint's learned prefill rate × the target time."""

from __future__ import annotations

import math

import pytest

from slorouter.flowcontrol.config import FlowControlConfig
from slorouter.flowcontrol.prefill import PrefillRates
from slorouter.flowcontrol.saturation import SaturationDetector, SaturationThresholds
from slorouter.pool.state import Endpoint, PoolState

A, B = "pod-0:8000", "pod-1:8000"


def _pool() -> PoolState:
    return PoolState([Endpoint(A), Endpoint(B)])


def test_rate_is_a_ratio_of_sums_after_enough_samples() -> None:
    rates = PrefillRates(min_samples=3, decay=0.5)
    rates.observe(A, 1000, 0.1)
    rates.observe(A, 1000, 0.1)
    assert rates.rate(A) is None  # not learned yet
    rates.observe(A, 8000, 0.4)
    # decayed sums: tokens (1000·0.5 + 1000)·0.5 + 8000 = 8750, seconds (0.05 + 0.1)·0.5 + 0.4 = 0.475
    assert rates.rate(A) == pytest.approx(8750 / 0.475)
    assert rates.rate(B) is None
    rates.observe(B, 0, 0.1)  # nothing ahead, or no time: not a sample
    rates.observe(B, 100, 0.0)
    assert rates.rate(B) is None


def test_long_backlogs_dominate_the_estimate() -> None:
    rates = PrefillRates(min_samples=1)
    for _ in range(100):
        rates.observe(A, 200, 0.05)  # light load: one short prompt, mostly one engine step (4,000 tok/s)
    for _ in range(100):
        rates.observe(A, 20_000, 1.0)  # a backlog worked off at 20,000 tok/s
    rate = rates.rate(A)
    assert rate is not None and 18_000 < rate < 20_000


def _learned(detector: SaturationDetector, address: str, rate: float) -> None:
    for _ in range(detector.prefill_rates.min_samples):
        detector.observe_first_token(address, int(rate), 1.0)


def test_derived_bound_gates_an_endpoint_at_rate_times_target() -> None:
    pool = _pool()
    detector = SaturationDetector(pool, SaturationThresholds(prefill_target_s=0.5))
    assert detector.prefill_bound(A) is None and detector.room() == math.inf  # nothing learned: no bound
    _learned(detector, A, 10_000)
    assert detector.prefill_bound(A) == pytest.approx(5_000)
    pool.add_inflight(A, 3, 4_999, 0)
    assert detector.room() == math.inf  # A under its bound takes one more; B has no bound yet
    _learned(detector, B, 10_000)
    assert detector.room() == 2  # each under its bound: one request per pump
    pool.add_inflight(A, 1, 1, 0)
    assert detector.room() == 1 and detector.saturation() == 0.5  # A reached 5,000 tokens in flight


def test_configured_bound_wins_and_none_target_derives_nothing() -> None:
    pool = _pool()
    configured = SaturationDetector(pool, SaturationThresholds(max_inflight_prefill_tokens=100))
    assert configured.prefill_bound(A) == 100  # before any sample
    off = SaturationDetector(pool, SaturationThresholds(prefill_target_s=None))
    _learned(off, A, 10_000)
    assert off.prefill_bound(A) is None


def test_prefill_target_time_from_the_config() -> None:
    section = FlowControlConfig.model_validate(
        {"enabled": True, "saturationDetector": {"prefillTargetTime": "250ms"}}
    )
    assert section.saturation_detector.thresholds().prefill_target_s == pytest.approx(0.25)
    assert FlowControlConfig().saturation_detector.prefill_target_s == 0.1
    off = FlowControlConfig.model_validate({"saturationDetector": {"prefillTargetTime": None}})
    assert off.saturation_detector.thresholds().prefill_target_s is None
    with pytest.raises(ValueError, match="prefillTargetTime"):
        FlowControlConfig.model_validate({"saturationDetector": {"prefillTargetTime": 0}})


def test_the_bound_tightens_while_requests_wait_in_the_router() -> None:
    pool = _pool()
    thresholds = SaturationThresholds(prefill_target_s=0.5, queued_prefill_target_s=0.05)
    detector = SaturationDetector(pool, thresholds)
    _learned(detector, A, 10_000)
    _learned(detector, B, 10_000)
    assert detector.prefill_bound(A) == pytest.approx(5_000)
    assert detector.prefill_bound(A, contended=True) == pytest.approx(500)
    pool.add_inflight(A, 1, 1_000, 0)
    assert detector.room() == 2 and detector.room(contended=True) == 1  # A is over the tighter bound
    assert detector.saturation(contended=True) == 0.5
    same = SaturationDetector(pool, SaturationThresholds(prefill_target_s=0.5, queued_prefill_target_s=None))
    _learned(same, A, 10_000)
    assert same.prefill_bound(A, contended=True) == pytest.approx(5_000)


def test_queued_prefill_target_time_from_the_config() -> None:
    section = FlowControlConfig.model_validate({"saturationDetector": {"queuedPrefillTargetTime": "5ms"}})
    assert section.saturation_detector.thresholds().queued_prefill_target_s == pytest.approx(0.005)
    assert FlowControlConfig().saturation_detector.queued_prefill_target_s == 0.02
    with pytest.raises(ValueError, match="queuedPrefillTargetTime"):
        FlowControlConfig.model_validate({"saturationDetector": {"queuedPrefillTargetTime": -1}})
