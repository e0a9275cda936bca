"""The plain-Python small-set path (ListScorer / ListPicker) gives exactly what the numpy path gives.

Every comparison is bit for bit (``float.hex``), on random inputs, including the awkward values: ties,
zeros, NaN, infinities, scores outside [0, 1].
"""

from __future__ import annotations

import numpy as np
import pytest

from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling import scheduler as scheduler_module
from slorouter.scheduling.datakeys import INFLIGHT_TOKENS, PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS
from slorouter.scheduling.plugin import ListScorer, Plugin, PluginParams, Scorer
from slorouter.scheduling.plugins.inflight import TokenLoadParams, TokenLoadScorer
from slorouter.scheduling.plugins.pickers import MaxScorePicker, PickerParams
from slorouter.scheduling.plugins.prefix.approx import PrefixCacheScorer
from slorouter.scheduling.plugins.scorers import (
    KVCacheUtilizationScorer,
    QueueScorer,
    RunningRequestsSizeScorer,
    min_max_inverted,
    min_max_inverted_list,
)
from slorouter.scheduling.scheduler import SchedulerProfile, WeightedScorer
from slorouter.scheduling.types import CycleState, InferenceRequest
from tests.helpers.scheduling import bits, make_ctx, make_director, make_request, random_candidates, serve

# NaN and infinite inputs make numpy warn; the comparisons are the point here.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, float("nan"), float("inf"), -float("inf")]


def random_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    values = rng.choice([rng.normal(0.5, 1.0), *SPECIAL], size=n)
    return np.where(rng.random(n) < 0.5, rng.normal(0.5, 1.0, size=n), values)


@pytest.mark.parametrize(
    "scorer_cls", [QueueScorer, RunningRequestsSizeScorer, KVCacheUtilizationScorer, PrefixCacheScorer]
)
def test_scorers_agree_on_random_pools(scorer_cls):
    rng = np.random.default_rng(1)
    scorer = scorer_cls("", scorer_cls.Params(), make_ctx())
    for _ in range(300):
        candidates = random_candidates(rng, int(rng.integers(1, 17)))
        expected = scorer.score(CycleState(), make_request(), candidates)
        assert bits(scorer.score_list(CycleState(), make_request(), candidates)) == bits(expected)


def test_token_load_scorer_agrees_including_missing_data():
    rng = np.random.default_rng(2)
    for threshold in (1, 1000, 4_194_304):
        scorer = TokenLoadScorer("", TokenLoadParams(queueThresholdTokens=threshold), make_ctx())
        for _ in range(100):
            candidates = random_candidates(rng, int(rng.integers(1, 17)))
            if rng.random() < 0.2:
                del candidates.attrs[INFLIGHT_TOKENS]
            expected = scorer.score(CycleState(), make_request(), candidates)
            assert bits(scorer.score_list(CycleState(), make_request(), candidates)) == bits(expected)


def test_prefix_scorer_agrees_on_float_and_missing_data():
    rng = np.random.default_rng(3)
    scorer = PrefixCacheScorer("", PluginParams(), make_ctx())
    for _ in range(200):
        n = int(rng.integers(1, 9))
        candidates = random_candidates(rng, n)
        if rng.random() < 0.5:  # another producer may attach floats, even NaN
            candidates.attrs[PREFIX_TOTAL_BLOCKS] = random_floats(rng, n)
            candidates.attrs[PREFIX_MATCH_BLOCKS] = random_floats(rng, n)
        if rng.random() < 0.1:
            del candidates.attrs[PREFIX_MATCH_BLOCKS]
        expected = scorer.score(CycleState(), make_request(), candidates)
        assert bits(scorer.score_list(CycleState(), make_request(), candidates)) == bits(expected)


def test_min_max_inverted_agrees_on_special_values():
    rng = np.random.default_rng(4)
    for _ in range(2000):
        values = random_floats(rng, int(rng.integers(1, 9)))
        # Which of -0.0 and 0.0 numpy's min/max return is up to its SIMD code, so the sign of a zero score
        # may differ here (it cannot for the scorers, whose columns are integers; and clamping erases it).
        unsigned = [v + 0.0 for v in min_max_inverted(values).tolist()]
        assert bits([v + 0.0 for v in min_max_inverted_list(values.tolist())]) == bits(unsigned)
    big = np.array([2**62 + 1, 2**62, 3], dtype=np.int64)  # int64 → float64 rounding, as numpy does it
    assert bits(min_max_inverted_list(big.tolist())) == bits(min_max_inverted(big))


class _ListFixed(Plugin, ListScorer):
    """Scores given per pool position, through both paths."""

    def __init__(self, values: np.ndarray) -> None:
        super().__init__("fixed", PluginParams(), make_ctx())
        self.values = values

    def score(self, cycle, request, candidates):
        return self.values[candidates.positions]

    def score_list(self, cycle, request, candidates):
        return self.values[candidates.positions].tolist()


def test_profile_totals_agree_with_clamping_nan_and_weights():
    rng = np.random.default_rng(5)
    picker = MaxScorePicker("", PickerParams(), make_ctx())
    for _ in range(500):
        n = int(rng.integers(1, 17))
        weights = [
            float(rng.choice([0.0, 1.0, 2.0, 3.0, rng.random()])) for _ in range(int(rng.integers(0, 5)))
        ]
        scorers = [WeightedScorer(_ListFixed(random_floats(rng, n)), weight) for weight in weights]
        profile = SchedulerProfile("p", [], scorers, picker)
        candidates = random_candidates(rng, n)
        total = profile.total_scores(CycleState(), make_request(), candidates)
        assert bits(profile.total_scores_list(CycleState(), make_request(), candidates)) == bits(total)


def test_max_score_picker_agrees_and_draws_the_same_numbers():
    rng = np.random.default_rng(6)
    for k in (1, 2, 3, 5):
        vector = MaxScorePicker("", PickerParams(maxNumOfEndpoints=k), make_ctx(seed=k))
        listed = MaxScorePicker("", PickerParams(maxNumOfEndpoints=k), make_ctx(seed=k))
        for _ in range(500):
            n = int(rng.integers(1, 17))
            scores = rng.choice([0.0, -0.0, 1.0, 2.5, 7.0, rng.random()], size=n)  # many ties
            candidates = random_candidates(rng, n)
            expected = vector.pick(CycleState(), make_request(), candidates, scores).tolist()
            got = listed.pick_list(CycleState(), make_request(), candidates, scores.tolist())
            assert got == expected
        assert vector.ctx.rng.random() == listed.ctx.rng.random()


def test_profiles_without_list_twins_take_the_numpy_path():
    class NumpyOnly(Plugin, Scorer):
        def score(self, cycle, request, candidates):
            return np.ones(len(candidates))

    picker = MaxScorePicker("", PickerParams(), make_ctx())
    scorer = WeightedScorer(NumpyOnly("x", PluginParams(), make_ctx()), 1.0)
    profile = SchedulerProfile("p", [], [scorer], picker)
    candidates = random_candidates(np.random.default_rng(0), 2)
    with pytest.raises(TypeError):
        profile.total_scores_list(CycleState(), make_request(), candidates)
    assert profile.run(CycleState(), make_request(), candidates) is not None


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_default_profile_schedules_identically_on_both_paths(monkeypatch, n):
    """The built-in profile (queue 2, KV 2, prefix 3, max-score picker) and its prefix producer."""
    rng = np.random.default_rng(n)
    prompts = [("shared system prompt " * int(rng.integers(0, 12))) + f"question {i}" for i in range(40)]
    runs = []
    for threshold in (scheduler_module.LIST_PATH_MAX_CANDIDATES, 0):  # list path, then numpy path
        monkeypatch.setattr(scheduler_module, "LIST_PATH_MAX_CANDIDATES", threshold)
        signals = np.random.default_rng(100 + n)
        pool = PoolState([Endpoint(f"10.2.0.{i + 1}:8000") for i in range(n)])
        director = make_director(pool, seed=7)
        picks = []
        for i in range(400):
            for endpoint in pool.endpoints:
                snapshot = MetricsSnapshot(
                    waiting=int(signals.integers(0, 3)),
                    kv_usage=float(signals.choice([0.0, 0.5, signals.random()])),
                    block_size=16,
                    num_gpu_blocks=200,
                )
                pool.set_metrics(endpoint.address, snapshot, at=0.0)
            request = InferenceRequest(str(i), "m", prompts[int(signals.integers(len(prompts)))], 10, 4)
            result = serve(director, request)
            picks.append(([e.address for e in result.primary.targets], bits(result.primary.scores)))
        runs.append(picks)
    assert runs[0] == runs[1]
