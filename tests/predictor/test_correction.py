from __future__ import annotations

import numpy as np
import pytest

from slorouter.predictor.correction import EndpointCorrection


def feed(correction: EndpointCorrection, endpoint: str, slowdown: float, n: int, seed: int) -> None:
    """Requests whose actual latency is ``slowdown`` × a log-normal around a calibrated p90 prediction."""
    rng = np.random.default_rng(seed)
    sigma = 0.3
    for _ in range(n):
        predicted = float(rng.uniform(20, 2000))
        median = predicted / np.exp(1.2816 * sigma)  # the prediction is the p90 of the normal replica
        actual = slowdown * median * float(rng.lognormal(0.0, sigma))
        correction.observe(endpoint, "ttft", predicted, actual)


def test_slow_replica_gets_factor_two_after_a_few_dozen_requests() -> None:
    correction = EndpointCorrection()
    feed(correction, "fast:8000", 1.0, 40, seed=1)
    feed(correction, "slow:8000", 2.0, 40, seed=2)
    fast, slow, unknown = correction.factors(["fast:8000", "slow:8000", "new:8000"], "ttft")
    assert fast == pytest.approx(1.0, rel=0.25)
    assert slow == pytest.approx(2.0, rel=0.25)
    assert unknown == 1.0
    assert correction.factors(["slow:8000"], "tpot")[0] == 1.0  # per kind


def test_too_few_samples_and_absurd_ratios() -> None:
    correction = EndpointCorrection(min_samples=12)
    for _ in range(11):
        correction.observe("a", "ttft", 100.0, 300.0)
    assert correction.factor("a", "ttft") == 1.0
    assert not correction.observe("a", "ttft", 100.0, 100_000.0)  # 1000x: a timeout, not a slow pod
    assert not correction.observe("a", "ttft", 0.0, 10.0)
    assert not correction.observe("a", "ttft", float("nan"), 10.0)
    assert correction.ignored == 3 and correction.samples("a", "ttft") == 11
    correction.observe("a", "ttft", 100.0, 300.0)
    assert correction.factor("a", "ttft") == pytest.approx(3.0)


def test_adapts_to_change_and_forgets() -> None:
    correction = EndpointCorrection(half_life_samples=8)
    feed(correction, "a", 1.0, 60, seed=3)
    feed(correction, "a", 3.0, 40, seed=4)  # the pod got slower
    assert correction.factor("a", "ttft") == pytest.approx(3.0, rel=0.3)
    feed(correction, "b", 1.0, 40, seed=5)
    correction.retain(["b"])
    assert correction.factor("a", "ttft") == 1.0 and correction.samples("a", "ttft") == 0
    assert set(correction.snapshot()) == {"b"}
    correction.forget("b")
    assert correction.snapshot() == {}


def test_factor_is_clipped() -> None:
    correction = EndpointCorrection(max_factor=5.0)
    for _ in range(20):
        correction.observe("a", "tpot", 10.0, 150.0)  # 15x: allowed ratio, clipped factor
    assert correction.factor("a", "tpot") == 5.0


def test_factor_is_the_recency_weighted_quantile_of_the_window() -> None:
    correction = EndpointCorrection(half_life_samples=5.0, min_samples=3, window=16, quantile=0.8)
    rng = np.random.default_rng(11)
    history: list[float] = []
    for _ in range(40):  # past the window, so the ring wraps
        predicted, actual = float(rng.uniform(10, 100)), float(rng.uniform(10, 100))
        correction.observe("a", "ttft", predicted, actual)
        history.append(np.log(actual / predicted))
        newest_first = np.array(history[::-1][:16])
        if len(history) < 3:
            continue
        weights = 2.0 ** (-np.arange(len(newest_first)) / 5.0)
        order = np.argsort(newest_first)
        cumulative = np.cumsum(weights[order])
        k = min(int(np.searchsorted(cumulative, 0.8 * cumulative[-1])), len(order) - 1)
        expected = float(np.clip(np.exp(newest_first[order[k]]), 0.2, 5.0))
        assert correction.factor("a", "ttft") == pytest.approx(expected, rel=1e-12)
        assert correction.factors(["b", "a"], "ttft").tolist() == [1.0, correction.factor("a", "ttft")]


def test_factors_of_a_repeated_endpoint_list_follow_every_change() -> None:
    correction = EndpointCorrection(min_samples=3)
    pods = [f"pod-{i}" for i in range(6)]
    rng = np.random.default_rng(3)
    for step in range(300):
        pod = pods[int(rng.integers(len(pods)))]
        correction.observe(pod, "ttft", 100.0, float(rng.uniform(50, 400)))
        if step == 150:
            correction.forget("pod-2")
        if step == 200:
            correction.retain(pods[1:])
        asked = pods if step % 7 else pods[::-1]  # now and then another list, as when a pod is excluded
        got = correction.factors(asked, "ttft")
        assert got.tolist() == [correction.factor(pod, "ttft") for pod in asked]
        got[:] = 0.0  # the caller's copy: the next answer must not change
    assert correction.factors(pods, "tpot").tolist() == [1.0] * len(pods)
