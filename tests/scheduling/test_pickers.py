"""Pickers (reference §2.3): max-score with random tie-break, random, weighted random (A-Res)."""

from __future__ import annotations

import numpy as np
import pytest

from slorouter.scheduling.plugins.pickers import (
    MaxScorePicker,
    PickerParams,
    RandomPicker,
    WeightedRandomPicker,
)
from slorouter.scheduling.types import CycleState
from tests.helpers.scheduling import candidates_of, make_ctx, make_pool, make_request


def make_picker(cls, k=1, seed=0):
    return cls("", PickerParams(maxNumOfEndpoints=k), make_ctx(seed))


def pick(picker, scores):
    scores = np.asarray(scores, dtype=float)
    return picker.pick(CycleState(), make_request(), candidates_of(make_pool(len(scores))), scores).tolist()


def frequencies(picker, scores, draws):
    counts = np.zeros(len(scores))
    for _ in range(draws):
        counts[pick(picker, scores)[0]] += 1
    return counts / draws


def test_max_endpoints_parameter():
    assert PickerParams().max_num_of_endpoints == 1
    assert PickerParams(maxNumOfEndpoints=0).max_num_of_endpoints == 1
    assert PickerParams(maxNumOfEndpoints=-3).max_num_of_endpoints == 1


def test_max_score_picks_the_highest():
    assert pick(make_picker(MaxScorePicker), [0.1, 2.5, 0.3]) == [1]


def test_max_score_top_k_best_first():
    assert pick(make_picker(MaxScorePicker, k=3), [0.1, 2.5, 0.3, 1.0]) == [1, 3, 2]
    assert pick(make_picker(MaxScorePicker, k=10), [0.1, 2.5]) == [1, 0]


def test_max_score_breaks_ties_uniformly():
    freq = frequencies(make_picker(MaxScorePicker, seed=1), [1.0, 3.0, 3.0, 3.0, 2.0], 6000)
    assert freq[0] == freq[4] == 0
    np.testing.assert_allclose(freq[1:4], [1 / 3] * 3, atol=0.03)


def test_max_score_top_k_with_ties_keeps_order_by_score():
    picker = make_picker(MaxScorePicker, k=3, seed=2)
    seen = set()
    for _ in range(200):
        chosen = pick(picker, [2.0, 5.0, 2.0, 1.0, 2.0])
        assert chosen[0] == 1 and set(chosen[1:]) <= {0, 2, 4}
        seen.add(tuple(chosen[1:]))
    assert len(seen) == 6  # every ordered pair of the tied candidates shows up


def test_random_picker_is_uniform_and_ignores_scores():
    freq = frequencies(make_picker(RandomPicker, seed=3), [0.0, 9.0, 1.0, 5.0], 8000)
    np.testing.assert_allclose(freq, [0.25] * 4, atol=0.03)
    chosen = pick(make_picker(RandomPicker, k=3), [0.0, 9.0, 1.0, 5.0])
    assert len(chosen) == 3 and len(set(chosen)) == 3


def test_weighted_random_probability_is_proportional_to_score():
    scores = [1.0, 2.0, 3.0, 0.0, 4.0]
    freq = frequencies(make_picker(WeightedRandomPicker, seed=4), scores, 40_000)
    expected = np.array(scores) / sum(scores)  # 0.1, 0.2, 0.3, 0, 0.4
    np.testing.assert_allclose(freq, expected, atol=0.012)
    assert freq[3] == 0


def test_weighted_random_tiny_scores_still_proportional():
    # u^(1/s) underflows to 0 for s this small; comparing log(u)/s keeps the keys distinct.
    scores = [1e-6, 3e-6]
    freq = frequencies(make_picker(WeightedRandomPicker, seed=5), scores, 8000)
    np.testing.assert_allclose(freq, [0.25, 0.75], atol=0.03)


def test_weighted_random_all_zero_is_uniform():
    freq = frequencies(make_picker(WeightedRandomPicker, seed=6), [0.0, 0.0, 0.0, 0.0], 8000)
    np.testing.assert_allclose(freq, [0.25] * 4, atol=0.03)


def test_weighted_random_zero_scores_only_fill_up_k():
    picker = make_picker(WeightedRandomPicker, k=3, seed=7)
    for _ in range(100):
        chosen = pick(picker, [0.0, 1.0, 0.0, 2.0, 0.0])
        assert set(chosen[:2]) == {1, 3}
        assert chosen[2] in {0, 2, 4}


def test_weighted_random_k_distinct():
    chosen = pick(make_picker(WeightedRandomPicker, k=4, seed=8), [1.0, 2.0, 3.0, 4.0, 5.0])
    assert len(set(chosen)) == 4


@pytest.mark.parametrize("cls", [MaxScorePicker, RandomPicker, WeightedRandomPicker])
def test_same_seed_same_picks(cls):
    scores = [1.0, 1.0, 2.0, 2.0, 0.5]
    first = [pick(picker, scores) for picker in [make_picker(cls, seed=9)] for _ in range(50)]
    second = [pick(picker, scores) for picker in [make_picker(cls, seed=9)] for _ in range(50)]
    assert first == second
