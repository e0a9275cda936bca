"""Scorer formulas (reference §2.2), checked against hand-computed values."""

from __future__ import annotations

import numpy as np

from slorouter.scheduling.datakeys import PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS
from slorouter.scheduling.plugins.prefix.approx import PrefixCacheScorer
from slorouter.scheduling.plugins.scorers import (
    KVCacheUtilizationScorer,
    QueueScorer,
    RunningRequestsSizeScorer,
    min_max_inverted,
)
from slorouter.scheduling.types import CycleState
from tests.helpers.scheduling import candidates_of, make_ctx, make_pool, make_request


def score(scorer_cls, candidates, params=None):
    scorer = scorer_cls("", params or scorer_cls.Params(), make_ctx())
    return scorer.score(CycleState(), make_request(), candidates)


def test_min_max_inverted():
    np.testing.assert_allclose(min_max_inverted(np.array([0, 5, 10])), [1.0, 0.5, 0.0])
    np.testing.assert_allclose(min_max_inverted(np.array([2, 4, 3, 6])), [1.0, 0.5, 0.75, 0.0])
    np.testing.assert_allclose(min_max_inverted(np.array([7, 7, 7])), [1.0, 1.0, 1.0])


def test_queue_scorer_is_min_max_on_waiting():
    pool = make_pool(4, waiting=[2, 4, 3, 6], running=[9, 9, 9, 9])
    np.testing.assert_allclose(score(QueueScorer, candidates_of(pool)), [1.0, 0.5, 0.75, 0.0])


def test_queue_scorer_all_equal_is_one():
    pool = make_pool(3, waiting=[5, 5, 5])
    np.testing.assert_allclose(score(QueueScorer, candidates_of(pool)), [1.0, 1.0, 1.0])


def test_queue_scorer_is_relative_to_the_surviving_candidates():
    pool = make_pool(3, waiting=[0, 10, 20])
    survivors = candidates_of(pool).subset(np.array([1, 2]))
    np.testing.assert_allclose(score(QueueScorer, survivors), [1.0, 0.0])


def test_running_requests_size_scorer():
    pool = make_pool(3, running=[1, 3, 5], waiting=[0, 0, 100])
    np.testing.assert_allclose(score(RunningRequestsSizeScorer, candidates_of(pool)), [1.0, 0.5, 0.0])


def test_kv_cache_utilization_scorer_is_absolute():
    pool = make_pool(3, kv_usage=[0.0, 0.25, 0.9])
    np.testing.assert_allclose(score(KVCacheUtilizationScorer, candidates_of(pool)), [1.0, 0.75, 0.1])


def test_prefix_cache_scorer_ratio():
    candidates = candidates_of(make_pool(3))
    candidates.attrs[PREFIX_MATCH_BLOCKS] = np.array([0, 3, 4])
    candidates.attrs[PREFIX_TOTAL_BLOCKS] = np.array([4, 4, 4])
    np.testing.assert_allclose(score(PrefixCacheScorer, candidates), [0.0, 0.75, 1.0])


def test_prefix_cache_scorer_zero_without_data_or_blocks():
    candidates = candidates_of(make_pool(2))
    np.testing.assert_allclose(score(PrefixCacheScorer, candidates), [0.0, 0.0])
    candidates.attrs[PREFIX_MATCH_BLOCKS] = np.array([0, 0])
    candidates.attrs[PREFIX_TOTAL_BLOCKS] = np.array([0, 0])
    np.testing.assert_allclose(score(PrefixCacheScorer, candidates), [0.0, 0.0])
