"""candidate-profile-handler: the tuner's lever over which pipeline routes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slorouter.scheduling.config_schema import SchedulerConfigError
from slorouter.scheduling.pipelines import SELF_TUNING_CANDIDATES, SELF_TUNING_SCHEDULER_CONFIG
from slorouter.scheduling.types import Route
from tests.helpers.scheduling import make_director, make_pool, make_request, serve


def two_candidates(**parameters: Any) -> dict[str, Any]:
    """Candidate ``first`` always picks pod 0 (its queue is empty), ``second`` pod 1 (its KV is empty)."""
    return {
        "plugins": [
            {
                "type": "candidate-profile-handler",
                "parameters": {
                    "candidates": [
                        {"name": "first", "profile": "by-queue"},
                        {"name": "second", "profile": "by-kv"},
                    ],
                    **parameters,
                },
            },
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "by-queue",
                "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": "max-score-picker"}],
            },
            {
                "name": "by-kv",
                "plugins": [{"pluginRef": "kv-cache-utilization-scorer"}, {"pluginRef": "max-score-picker"}],
            },
        ],
    }


def pool():
    return make_pool(2, waiting=[0, 9], kv_usage=[0.9, 0.0])


def test_the_active_candidate_routes_and_a_switch_takes_effect_on_the_next_request():
    director = make_director(pool(), two_candidates())
    switch = director.setup.candidate_switch
    assert switch is not None and switch.candidates == ("first", "second") and switch.active == "first"
    first = serve(director, make_request("a" * 64))
    assert first.primary_profile == "by-queue" and first.target.address.endswith(".1:8000")
    switch.activate("second")
    second = serve(director, make_request("a" * 64))
    assert second.primary_profile == "by-kv" and second.target.address.endswith(".2:8000")


def test_the_configured_active_candidate_starts():
    director = make_director(pool(), two_candidates(active="second"))
    assert director.setup.candidate_switch is not None
    assert director.setup.candidate_switch.active == "second"


def test_an_unknown_candidate_is_refused_and_the_active_one_kept():
    director = make_director(pool(), two_candidates())
    switch = director.setup.candidate_switch
    assert switch is not None
    with pytest.raises(ValueError, match="unknown candidate 'third'"):
        switch.activate("third")
    assert switch.active == "first"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"active": "third"}, "active candidate 'third' is not one of the candidates"),
        (
            {"candidates": [{"name": "x", "profile": "by-queue"}, {"name": "x", "profile": "by-kv"}]},
            "repeated: x",
        ),
        ({"candidates": [{"name": "x", "profile": "nowhere"}]}, "not configured: nowhere"),
        ({"candidates": []}, "candidates"),
    ],
)
def test_bad_candidate_configurations_name_the_problem(change, message):
    config = two_candidates()
    config["plugins"][0]["parameters"].update(change)
    with pytest.raises(SchedulerConfigError, match=message):
        make_director(pool(), config)


def test_a_predicted_candidate_without_predictions_runs_its_fallback_profile_marked_fallback():
    config = two_candidates()
    config["plugins"][0]["parameters"]["candidates"][0]["fallbackProfile"] = "by-kv"
    director = make_director(pool(), config)
    request = make_request("a" * 64)
    request.prediction_unavailable = "warming-up"
    result = serve(director, request)
    assert result.primary_profile == "by-kv" and result.route is Route.FALLBACK


def test_other_setups_have_no_switch():
    assert make_director(pool()).setup.candidate_switch is None


def test_the_self_tuning_pipeline_offers_every_candidate_and_starts_on_the_built_in_one():
    director = make_director(make_pool(3), copy.deepcopy(SELF_TUNING_SCHEDULER_CONFIG))
    switch = director.setup.candidate_switch
    assert switch is not None
    assert switch.candidates == SELF_TUNING_CANDIDATES and switch.active == "predicted-latency"
    for name in SELF_TUNING_CANDIDATES:
        switch.activate(name)
        assert serve(director, make_request("b" * 256)).target is not None
