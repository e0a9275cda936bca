"""The scheduling cycle: filters, clamped weighted scores, picker, profile handler loop, errors."""

from __future__ import annotations

import numpy as np
import pytest

from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import Plugin, PluginParams, Scorer
from slorouter.scheduling.plugins.pickers import MaxScorePicker, PickerParams
from slorouter.scheduling.plugins.profile_handlers import SingleProfileHandler
from slorouter.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer
from slorouter.scheduling.types import CycleState, NoCandidatesError, NoEndpointPickedError, Route
from tests.helpers.scheduling import (
    addresses,
    candidates_of,
    make_ctx,
    make_director,
    make_pool,
    make_request,
    serve,
)

from . import fake_plugins


def fixed(values, ctx=None):
    return fake_plugins.FixedScorer("", fake_plugins.FixedScoresParams(values=values), ctx or make_ctx())


def keep(positions):
    return fake_plugins.KeepFilter("keep", fake_plugins.KeepParams(positions=positions), make_ctx())


def single_profile_scheduler(filters=(), scorers=(), k=1, seed=0):
    ctx = make_ctx(seed)
    picker = MaxScorePicker("", PickerParams(maxNumOfEndpoints=k), ctx)
    profile = SchedulerProfile("default", list(filters), list(scorers), picker)
    return Scheduler([profile], SingleProfileHandler("", PluginParams(), ctx))


def test_total_is_unnormalised_weighted_sum_of_clamped_scores():
    profile = SchedulerProfile(
        "p",
        [],
        [
            WeightedScorer(fixed([0.8, 0.2, 1.0]), 2.0),
            WeightedScorer(fixed([0.5, 1.5, -0.7]), 1.0),  # clamped to 0.5, 1.0, 0.0
            WeightedScorer(fixed([float("nan"), 0.1, 0.1]), 0.5),  # NaN counts as 0
        ],
        MaxScorePicker("", PickerParams(), make_ctx()),
    )
    total = profile.total_scores(CycleState(), make_request(), candidates_of(make_pool(3)))
    np.testing.assert_allclose(total, [0.8 * 2 + 0.5, 0.2 * 2 + 1.0 + 0.05, 2.0 + 0.0 + 0.05])


def test_zero_weight_scorer_has_no_effect():
    scheduler = single_profile_scheduler(
        scorers=[WeightedScorer(fixed([0.0, 1.0]), 0.0), WeightedScorer(fixed([1.0, 0.0]), 1.0)]
    )
    result = scheduler.schedule(make_request(), candidates_of(make_pool(2)))
    assert result.target.address == addresses(2)[0]


def test_result_carries_targets_scores_and_route():
    scheduler = single_profile_scheduler(scorers=[WeightedScorer(fixed([0.1, 0.9, 0.5]), 2.0)], k=2)
    result = scheduler.schedule(make_request(), candidates_of(make_pool(3)))
    assert result.primary_profile == "default"
    assert [e.address for e in result.primary.targets] == [addresses(3)[1], addresses(3)[2]]
    np.testing.assert_allclose(result.primary.scores, [1.8, 1.0])
    assert result.primary.route is Route.HEURISTIC and result.primary.route == "heuristic"


def test_a_plugin_can_name_the_route():
    route = fake_plugins.RouteScorer("", PluginParams(), make_ctx())
    scheduler = single_profile_scheduler(scorers=[WeightedScorer(route, 1.0)])
    cycle = CycleState()
    result = scheduler.schedule(make_request(), candidates_of(make_pool(2)), cycle)
    assert result.primary.route == "predicted"
    assert "route" not in cycle


def test_filters_run_in_order_on_the_survivors():
    scheduler = single_profile_scheduler(
        filters=[keep([0, 1, 2]), keep([1, 2, 3])], scorers=[WeightedScorer(fixed([9, 1, 2, 9]), 1.0)]
    )
    cycle = CycleState()
    result = scheduler.schedule(make_request(), candidates_of(make_pool(4)), cycle)
    assert result.target.address == addresses(4)[2]
    assert cycle["filters_run"] == ["keep", "keep"]


def test_filter_that_empties_the_profile_fails_with_429_and_skips_later_filters():
    scheduler = single_profile_scheduler(filters=[keep([]), keep([0])])
    cycle = CycleState()
    with pytest.raises(NoEndpointPickedError) as info:
        scheduler.schedule(make_request(), candidates_of(make_pool(3)), cycle)
    assert info.value.status == 429
    assert "removed every candidate" in info.value.message
    assert cycle["filters_run"] == ["keep"]


def test_profile_run_returns_none_when_filtered_empty():
    profile = SchedulerProfile("p", [keep([])], [], MaxScorePicker("", PickerParams(), make_ctx()))
    assert profile.run(CycleState(), make_request(), candidates_of(make_pool(2))) is None


def test_no_candidates_is_503():
    scheduler = single_profile_scheduler()
    empty = candidates_of(make_pool(2)).subset(np.array([], dtype=int))
    with pytest.raises(NoCandidatesError) as info:
        scheduler.schedule(make_request(), empty)
    assert info.value.status == 503


class OneScoreScorer(Plugin, Scorer):
    type_name = "test-one-score"

    def score(self, cycle, request, candidates):
        return np.ones(1)


def test_scorer_with_wrong_length_is_a_bug():
    scorer = OneScoreScorer("", PluginParams(), make_ctx())
    scheduler = single_profile_scheduler(scorers=[WeightedScorer(scorer, 1.0)])
    with pytest.raises(ValueError, match=r"test-one-score returned \(1,\) scores for 2 candidates"):
        scheduler.schedule(make_request(), candidates_of(make_pool(2)))


def two_profile_setup(decode_keep, prefill_keep, seed=0):
    config = {
        "plugins": [
            {"type": "test-prefill-decode-handler", "name": "handler"},
            {"type": "test-keep-filter", "name": "decode-filter", "parameters": {"positions": decode_keep}},
            {"type": "test-keep-filter", "name": "prefill-filter", "parameters": {"positions": prefill_keep}},
        ],
        "schedulingProfiles": [
            {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}]},
            {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}]},
        ],
    }
    return build_scheduler_setup(config, make_ctx(seed))


def test_profile_handler_loop_runs_profiles_in_its_order():
    setup = two_profile_setup([0], [1])
    cycle = CycleState()
    result = setup.scheduler.schedule(make_request(), candidates_of(make_pool(3)), cycle)
    assert cycle["rounds"] == [[], ["prefill"], ["decode", "prefill"]]
    assert result.primary_profile == "decode"
    assert result.target.address == addresses(3)[0]
    assert result.profile_results["prefill"].targets[0].address == addresses(3)[1]


def test_handler_sees_failed_profiles_as_none():
    setup = two_profile_setup([0], [])
    result = setup.scheduler.schedule(make_request(), candidates_of(make_pool(3)))
    assert result.profile_results["prefill"] is None
    assert result.target.address == addresses(3)[0]


def test_all_profiles_failing_is_429():
    setup = two_profile_setup([], [])
    with pytest.raises(NoEndpointPickedError, match="decode: filter decode-filter"):
        setup.scheduler.schedule(make_request(), candidates_of(make_pool(3)))


def test_same_seed_same_decisions():
    def decisions(seed):
        director = make_director(make_pool(8, waiting=[1, 1, 2, 1, 3, 1, 1, 2]), seed=seed)
        picks = []
        for i in range(40):
            # Unique prompts (no prefix affinity) on equally loaded pods: ties, broken at random.
            request = make_request(f"{i} a prompt with no shared prefix " * 5, request_id=str(i))
            picks.append(serve(director, request).target.address)
        return picks

    assert decisions(11) == decisions(11)
    assert len(set(decisions(11))) > 1
