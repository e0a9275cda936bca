"""Pick records (every candidate of the primary profile: score, expected TTFT, cached prefix; chosen,
runner-up, reason) and the regret formulas over them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slorouter.pool.state import MetricsSnapshot
from slorouter.scheduling.datakeys import (
    EXPECTED_TTFT_MS,
    PREDICTED_TTFT_MS,
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
)
from slorouter.scheduling.pick_record import (
    NO_RUNNER_UP,
    PickRecord,
    TtftSource,
    expected_ttft,
    prefix_tokens_held,
    runner_up_in_array,
    runner_up_in_list,
)
from slorouter.scheduling.plugin import PluginParams
from slorouter.scheduling.plugins.pickers import MaxScorePicker, PickerParams, RoundRobinPicker
from slorouter.scheduling.plugins.profile_handlers import SingleProfileHandler
from slorouter.scheduling.plugins.scorers import QueueScorer
from slorouter.scheduling.regret import regret_of, ttft_regret_of
from slorouter.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer
from slorouter.scheduling.types import CycleState, PickReason
from tests.helpers.scheduling import candidates_of, make_ctx, make_pool, make_request

from . import fake_plugins


def _scheduler(values, *, keep=None, picker=None):
    ctx = make_ctx()
    filters = []
    if keep is not None:
        filters.append(fake_plugins.KeepFilter("keep", fake_plugins.KeepParams(positions=keep), ctx))
    scorer = fake_plugins.FixedScorer("", fake_plugins.FixedScoresParams(values=values), ctx)
    profile = SchedulerProfile(
        "default", filters, [WeightedScorer(scorer, 1.0)], picker or MaxScorePicker("", PickerParams(), ctx)
    )
    return Scheduler([profile], SingleProfileHandler("", PluginParams(), ctx))


def _record(scheduler, candidates, request=None) -> PickRecord:
    result = scheduler.schedule(request or make_request(), candidates, CycleState(record=True))
    assert result.record is not None
    return result.record


def test_no_record_unless_the_cycle_asks():
    result = _scheduler([0.1, 0.9]).schedule(make_request(), candidates_of(make_pool(2)))
    assert result.record is None


def test_record_holds_every_candidate_chosen_runner_up_and_reason():
    record = _record(_scheduler([0.2, 0.9, 0.5]), candidates_of(make_pool(3)))
    assert [e.address for e in record.endpoints] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    np.testing.assert_allclose(record.scores, [0.2, 0.9, 0.5])
    assert (record.chosen, record.runner_up, record.reason) == (1, 2, PickReason.SCORE)
    assert record.profile == "default"
    assert record.ttft_ms is None and record.ttft_source is TtftSource.NONE
    assert record.prefix_tokens.tolist() == [0, 0, 0]  # no prefix producer ran


def test_filtered_candidates_have_no_score_and_indices_stay_the_given_ones():
    record = _record(_scheduler([0.2, 0.9, 0.5, 0.7], keep=[0, 2]), candidates_of(make_pool(4)))
    assert np.isnan(record.scores[[1, 3]]).all()
    np.testing.assert_allclose(record.scores[[0, 2]], [0.2, 0.5])
    assert (record.chosen, record.runner_up, record.reason) == (2, 0, PickReason.FILTER)


def test_one_scored_candidate_has_no_runner_up():
    record = _record(_scheduler([0.2, 0.9], keep=[0]), candidates_of(make_pool(2)))
    assert (record.chosen, record.runner_up) == (0, NO_RUNNER_UP)


def test_a_picker_that_does_not_take_the_top_score_is_the_reason():
    ctx = make_ctx()
    record = _record(
        _scheduler([0.9, 0.1], picker=RoundRobinPicker("", PickerParams(), ctx)), candidates_of(make_pool(2))
    )
    assert (record.chosen, record.reason) == (0, PickReason.SCORE)  # round robin starts at position 0
    scheduler = _scheduler([0.1, 0.9], picker=RoundRobinPicker("", PickerParams(), ctx))
    assert _record(scheduler, candidates_of(make_pool(2))).reason is PickReason.PICKER


@pytest.mark.parametrize("n", [3, 20])  # the plain-Python small-set path, and numpy's
def test_the_list_path_and_the_numpy_path_record_the_same(n):
    waiting = list(range(n))
    pool = make_pool(n, waiting=waiting)
    ctx = make_ctx()
    profile = SchedulerProfile(
        "p",
        [],
        [WeightedScorer(QueueScorer("", PluginParams(), ctx), 2.0)],
        MaxScorePicker("", PickerParams(), ctx),
    )
    scheduler = Scheduler([profile], SingleProfileHandler("", PluginParams(), ctx))
    record = _record(scheduler, candidates_of(pool))
    assert record.chosen == 0 and record.runner_up == 1
    assert record.scores[0] == 2.0 and np.all(np.diff(record.scores) < 0)


def test_prefix_tokens_held_is_matched_blocks_times_block_size_capped_at_the_prompt():
    candidates = candidates_of(make_pool(3))
    request = make_request(prompt_tokens=100)
    assert prefix_tokens_held(request, candidates).tolist() == [0, 0, 0]
    candidates.attrs[PREFIX_MATCH_BLOCKS] = np.array([0, 3, 9])
    candidates.attrs[PREFIX_BLOCK_SIZE_TOKENS] = np.array([16, 16, 16])
    assert prefix_tokens_held(request, candidates).tolist() == [0, 48, 100]


def test_expected_ttft_prefers_the_predictor_then_the_load_model():
    candidates = candidates_of(make_pool(2))
    assert expected_ttft(candidates) == (None, TtftSource.NONE)
    candidates.attrs[EXPECTED_TTFT_MS] = np.array([5.0, 6.0])
    ttft, source = expected_ttft(candidates)
    assert source is TtftSource.LOAD_MODEL and ttft is not None and ttft.tolist() == [5.0, 6.0]
    candidates.attrs[PREDICTED_TTFT_MS] = np.array([7.0, 8.0])
    ttft, source = expected_ttft(candidates)
    assert source is TtftSource.PREDICTOR and ttft is not None and ttft.tolist() == [7.0, 8.0]


def _bare_record(chosen, prefix, ttft=None) -> PickRecord:
    pool = make_pool(len(prefix))
    return PickRecord(
        profile="p",
        endpoints=list(pool.endpoints),
        scores=np.zeros(len(prefix)),
        ttft_ms=None if ttft is None else np.asarray(ttft, dtype=float),
        ttft_source=TtftSource.NONE if ttft is None else TtftSource.PREDICTOR,
        prefix_tokens=np.asarray(prefix, dtype=np.int64),
        prompt_tokens=512,
        chosen=chosen,
        runner_up=NO_RUNNER_UP,
        reason=PickReason.SCORE,
    )


def test_regret_reuse_is_chosen_held_against_the_most_held():
    regret = regret_of(_bare_record(1, [256, 64, 0]))
    assert (regret.achieved_prefix_tokens, regret.reachable_prefix_tokens) == (64, 256)
    assert regret.avoidable_prefill_tokens == 192
    assert regret.ttft_regret_ms is None
    assert regret_of(_bare_record(0, [256, 64, 0])).avoidable_prefill_tokens == 0


def test_ttft_regret_is_chosen_minus_the_best_finite_estimate():
    assert ttft_regret_of(_bare_record(0, [0, 0, 0], [120.0, 80.0, float("nan")])) == 40.0
    assert ttft_regret_of(_bare_record(1, [0, 0, 0], [120.0, 80.0, float("inf")])) == 0.0
    assert ttft_regret_of(_bare_record(2, [0, 0, 0], [120.0, 80.0, float("nan")])) is None


def test_a_cold_pod_chosen_shows_the_prefix_it_left_behind():
    pool = make_pool(2)
    pool.set_metrics("10.0.0.2:8000", MetricsSnapshot(waiting=0), at=0.0)
    candidates = candidates_of(pool)
    candidates.attrs[PREFIX_MATCH_BLOCKS] = np.array([4, 0])  # pod 0 warm, pod 1 cold
    candidates.attrs[PREFIX_BLOCK_SIZE_TOKENS] = np.array([16, 16])
    record = _record(_scheduler([0.1, 0.9]), candidates, make_request(prompt_tokens=64))
    regret = regret_of(record)
    assert (record.chosen, regret.achieved_prefix_tokens, regret.avoidable_prefill_tokens) == (1, 0, 64)


@given(
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5]), min_size=1, max_size=20).flatmap(
        lambda totals: st.tuples(st.just(totals), st.integers(0, len(totals) - 1))
    )
)
def test_the_list_path_finds_the_same_runner_up_as_numpy(case):
    totals, chosen = case
    array = np.array(totals)
    assert runner_up_in_list(totals, chosen) == runner_up_in_array(array, chosen)
    assert array.tolist() == totals  # the chosen total is put back
