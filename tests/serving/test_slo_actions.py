"""The plans of deadlines and hedges: which requests get one, when a hedge is due, the budget, the config."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slorouter.config import ConfigError, HedgingConfig, ObjectiveConfig, parse_config
from slorouter.scheduling.types import InferenceRequest
from slorouter.serving.slo_actions import (
    Action,
    CancelReason,
    HedgeBudget,
    HedgeOutcome,
    HedgeSkip,
    SloActions,
)


def _request(
    objective: str = "chat", ttft: float | None = 500.0, tpot: float | None = None
) -> InferenceRequest:
    return InferenceRequest(
        request_id="r",
        model="m",
        prompt_text="p",
        prompt_tokens=100,
        max_tokens=10,
        objective=objective,
        slo_ttft_ms=ttft,
        slo_tpot_ms=tpot,
        received_at=10.0,
    )


def _actions(**hedging: float) -> SloActions:
    objectives = {
        "chat": ObjectiveConfig(priority=1, deadline={"action": "hedge"}),
        "batch": ObjectiveConfig(
            priority=-1, deadline={"action": "cancel", "ttft_factor": 2.0, "tpot": True, "tpot_factor": 1.5}
        ),
        "plain": ObjectiveConfig(priority=1),
    }
    return SloActions(objectives, HedgingConfig(**hedging))


def test_only_requests_with_a_ttft_slo_of_an_objective_with_a_deadline_get_a_plan():
    actions = _actions()
    assert actions.plan(_request("plain")) is None
    assert actions.plan(_request("", 500.0)) is None
    assert actions.plan(_request("chat", None)) is None
    plan = actions.plan(_request("chat"))
    assert plan is not None and plan.action is Action.HEDGE and plan.tpot_limit_ms is None


def test_a_cancel_plan_has_its_deadline_from_arrival_and_its_tpot_limit():
    plan = _actions().plan(_request("batch", 500.0, tpot=20.0))
    assert plan is not None and plan.action is Action.CANCEL
    assert plan.deadline_at == pytest.approx(10.0 + 2 * 0.5)  # received at 10 s, SLO 500 ms, factor 2
    assert plan.tpot_limit_ms == pytest.approx(30.0)
    no_tpot_slo = _actions().plan(_request("batch", 500.0))
    assert no_tpot_slo is not None and no_tpot_slo.tpot_limit_ms is None


@pytest.mark.parametrize(
    ("predicted_ms", "expected_s"),
    [
        (100.0, 10.1 + 0.15),  # 1.5 × the prediction after the dispatch at 10.1 s
        (400.0, 10.1 + 0.6),  # a slow prediction: late against it, not against the 500 ms SLO
        (None, math.inf),  # no prediction: late cannot be told from slow, only a stall hedges
        (1.0, 10.1 + 0.02),  # never before min_delay_ms after the dispatch
    ],
)
def test_the_hedge_delay_rule(predicted_ms, expected_s):
    actions = _actions()
    plan = actions.plan(_request("chat"))
    assert plan is not None
    assert actions.hedge_at(plan, 10.0, 10.1, predicted_ms) == pytest.approx(expected_s)


def test_without_a_prediction_the_delay_may_be_a_share_of_the_slo():
    actions = _actions(max_slo_share=0.6)
    plan = actions.plan(_request("chat"))
    assert plan is not None
    assert actions.hedge_at(plan, 10.0, 10.1, None) == pytest.approx(10.0 + 0.3)  # 0.6 × the 500 ms SLO


def test_the_hedge_delay_may_be_capped_at_a_multiple_of_the_slo():
    actions = _actions(max_delay_slo_factor=2.0)
    plan = actions.plan(_request("chat"))
    assert plan is not None
    assert actions.hedge_at(plan, 10.0, 10.1, 4000.0) == pytest.approx(10.0 + 1.0)  # 2 × the 500 ms SLO
    assert actions.hedge_at(plan, 10.0, 10.1, 100.0) == pytest.approx(10.1 + 0.15)


def test_the_hedge_delay_may_wait_for_a_share_of_the_slo():
    actions = _actions(min_slo_share=0.5)
    plan = actions.plan(_request("chat"))
    assert plan is not None
    assert actions.hedge_at(plan, 10.0, 10.1, 100.0) == pytest.approx(10.0 + 0.25)  # not before 0.5 × 500 ms
    assert actions.hedge_at(plan, 10.0, 10.1, 400.0) == pytest.approx(10.1 + 0.6)


def test_the_budget_bounds_hedges_to_their_share_and_counts_skips():
    actions = _actions(max_share=0.1, burst=1.0)
    hedged = 0
    for _ in range(100):
        plan = actions.plan(_request("chat"))
        assert plan is not None
        hedged += actions.may_hedge(plan, saturated=False)
    assert hedged == 10  # the burst of 1, then one per ten requests (0.1 × 100, less the tenth not yet full)
    assert actions.skipped["chat", HedgeSkip.BUDGET] == 90
    plan = actions.plan(_request("chat"))
    assert plan is not None
    assert not actions.may_hedge(plan, saturated=True)
    assert actions.skipped["chat", HedgeSkip.SATURATED] == 1


@given(st.lists(st.booleans(), max_size=300), st.floats(0.0, 1.0), st.floats(1.0, 20.0))
def test_a_budget_never_gives_more_than_its_burst_plus_its_share(ops, share, burst):
    budget = HedgeBudget(share, burst)
    deposits = taken = 0
    for deposit in ops:
        if deposit:
            budget.deposit()
            deposits += 1
        else:
            taken += budget.take()
        assert 0.0 <= budget.level <= burst
    assert taken <= (burst if share > 0 else 0) + share * deposits + 1e-9


def test_the_counts_reach_the_status_page():
    actions = _actions()
    plan = actions.plan(_request("chat"))
    assert plan is not None
    actions.hedge_ended(plan, HedgeOutcome.SENT)
    actions.hedge_ended(plan, HedgeOutcome.WON, loser_prefill_tokens=80)
    batch = actions.plan(_request("batch"))
    assert batch is not None
    actions.cancelled_request(batch, CancelReason.TTFT)
    status = actions.status()
    assert status.objectives["chat"].hedges == {"sent": 1, "won": 1, "lost": 0, "failed": 0, "cancelled": 0}
    assert status.objectives["batch"].cancelled == {"ttft": 1, "tpot": 0}
    assert status.loser_prefill_tokens == 80
    assert "plain" not in status.objectives


@pytest.mark.parametrize(
    ("objective", "message"),
    [
        ({"priority": 0, "deadline": {"action": "cancel"}}, "cancel is for sheddable objectives"),
        ({"priority": -1, "deadline": {"action": "hedge"}}, "hedge is for objectives that are not sheddable"),
        ({"deadline": {"action": "retry"}}, "objectives.x.deadline.action"),
        ({"deadline": {"action": "cancel", "ttft_factor": 0}}, "ttft_factor"),
    ],
)
def test_bad_deadlines_are_config_errors_that_name_the_key(objective, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"objectives": {"x": objective}})


def test_hedging_limits_are_checked():
    with pytest.raises(ConfigError, match=r"hedging\.max_share"):
        parse_config({"hedging": {"max_share": 1.5}})


@pytest.mark.parametrize(
    ("hedging", "request_ms", "copy_ms", "expected_s"),
    [
        ({}, 100.0, 80.0, 10.0 + 0.18),  # overdue (past 100 ms) by the copy's 80 ms
        ({"overdue_factor": 2.0}, 100.0, 80.0, 10.0 + 0.26),
        ({"overdue_factor": None}, 100.0, 80.0, 10.15),  # no such rule: now
        ({}, None, 80.0, 10.15),  # a prediction missing: now
        ({}, 100.0, None, 10.15),
    ],
)
def test_a_copy_goes_once_the_request_is_overdue_by_the_copys_predicted_ttft(
    hedging, request_ms, copy_ms, expected_s
):
    actions = _actions(**hedging)
    assert actions.copy_due(10.0, 10.15, request_ms, copy_ms) == pytest.approx(expected_s)


def test_a_waiting_request_is_looked_at_every_half_stall_until_its_hedge_is_due():
    assert _actions().next_check(10.0, 11.0) == pytest.approx(10.25)  # stall_ms 500 by default
    assert _actions().next_check(10.0, 10.1) == pytest.approx(10.1)
    assert _actions(stall_ms=None).next_check(10.0, 11.0) == pytest.approx(11.0)
    assert _actions(stall_ms=None).stall_s is None
