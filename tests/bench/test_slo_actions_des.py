"""Deadlines and hedged requests in the discrete-event benchmark: the same plans as the gateway, carried out
on the simulated engines (the loser of a race and a cancelled request are aborted in their engine)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from slorouter.bench.cluster import ClusterSimulator
from slorouter.bench.policies import (
    BUILTIN_POLICIES,
    DEFAULT_DEADLINES,
    Deadlines,
    PolicyError,
    load_deadlines_file,
    resolve_policy,
)
from slorouter.bench.pool import parse_pool
from slorouter.bench.records import CANCELLED, OK
from slorouter.bench.workloads import BenchRequest
from slorouter.config import HedgingConfig
from tests.helpers.bench_requests import chat_requests


def _idle(sim: ClusterSimulator) -> bool:
    return all(not engine.has_work() for engine in sim.engines) and sim.tracker.outstanding() == 0


# Without predictions, a request is hedged for lateness only with hedging.max_slo_share (by default only a
# stall hedges it; a pod ten times slower keeps producing tokens).
LATENESS = dataclasses.replace(DEFAULT_DEADLINES, hedging=HedgingConfig(max_slo_share=0.6))


def test_a_slow_pod_is_hedged_around_and_every_request_ends_once():
    # Two fast pods and one ten times slower: with a 50 ms SLO, requests stuck on the slow pod get a copy.
    requests = chat_requests(600, qps=30, seed=5, slo_ttft_ms=50.0)
    pool = parse_pool("2x llama3-8b-h100 + 1x llama3-8b-h100@time=10")
    policy = BUILTIN_POLICIES["round-robin"]
    with ClusterSimulator(pool, policy, use_predictor=False, deadlines=LATENESS) as sim:
        rec = sim.run(requests)
        assert _idle(sim)
        assert np.all(sim.pool.columns["inflight_requests"] == 0)
    actions = rec.facts["slo_actions"]
    hedges = actions["hedges"]
    assert hedges["sent"] > 0 and hedges["won"] > 0
    assert hedges["sent"] == hedges.get("won", 0) + hedges.get("lost", 0) + hedges.get("failed", 0)
    budget = LATENESS.hedging
    assert hedges["sent"] <= budget.max_share * len(requests) + budget.burst  # the budget
    assert np.all(rec.status == OK)
    assert np.array_equal(rec.output_tokens, [r.max_tokens for r in requests])  # the winner's whole answer
    assert rec.facts["leaked_inflight"] == 0 and actions["loser_prefill_tokens"] > 0


def test_hedging_the_slow_pods_requests_improves_their_tail():
    requests = chat_requests(600, qps=30, seed=5, slo_ttft_ms=50.0)
    pool = parse_pool("2x llama3-8b-h100 + 1x llama3-8b-h100@time=10")
    policy = BUILTIN_POLICIES["round-robin"]
    p99 = {}
    for deadlines in (None, LATENESS):
        with ClusterSimulator(pool, policy, use_predictor=False, deadlines=deadlines) as sim:
            rec = sim.run(requests)
        p99[deadlines is not None] = float(np.percentile(rec.ttft_s, 99))
    assert p99[True] < p99[False]


def test_sheddable_requests_past_their_deadline_are_cancelled_and_their_engine_slots_freed():
    # One pod, a burst of sheddable requests: those without a first token by 40 ms are cancelled.
    requests = [
        BenchRequest(r.arrival, r.prompt, 300, slo_ttft_ms=40.0, priority=-1)
        for r in chat_requests(200, qps=400, seed=6)
    ]
    with ClusterSimulator(parse_pool("1"), None, use_predictor=False, deadlines=DEFAULT_DEADLINES) as sim:
        rec = sim.run(requests)
        assert _idle(sim)
    cancelled = rec.status == CANCELLED
    assert cancelled.sum() == rec.facts["slo_actions"]["cancelled"]["ttft"] > 0
    assert np.all(np.isnan(rec.ttft_s[cancelled]))  # none of them got a first token
    assert np.all((rec.status == OK) | cancelled) and (rec.status == OK).any()
    assert np.all(rec.ttft_s[rec.status == OK] * 1000 <= 40.0 + 1e-6)  # the rest kept their SLO


def test_the_slo_suffix_and_the_deadlines_file(tmp_path):
    policy = resolve_policy("token-aware+fc+slo")
    assert policy.name == "token-aware+fc+slo"
    assert policy.flow_control is not None and policy.deadlines is DEFAULT_DEADLINES
    path = tmp_path / "deadlines.yaml"
    path.write_text("objectives:\n  standard: {deadline: {action: none}}\nhedging: {max_share: 0.2}\n")
    deadlines = load_deadlines_file(path)
    assert deadlines.objectives["standard"].deadline.action == "none"
    assert deadlines.objectives["sheddable"].deadline.action == "cancel"
    assert deadlines.hedging.max_share == 0.2
    path.write_text("objectives:\n  vip: {deadline: {action: hedge}}\n")
    with pytest.raises(PolicyError, match=r"objectives\.vip"):
        load_deadlines_file(path)
    path.write_text("objectives:\n  sheddable: {priority: -1, deadline: {action: hedge}}\n")
    with pytest.raises(PolicyError, match="not sheddable"):
        load_deadlines_file(path)


def test_the_requests_of_a_stalled_pod_are_hedged_long_before_their_delay():
    # One of two pods pauses for 1.5 s every 3 s or so; a 5 s SLO puts the hedge delay (no prediction: 0.6 ×
    # the SLO) past every pause, so only the stall check hedges the requests caught in one.
    requests = chat_requests(400, qps=20, seed=7, slo_ttft_ms=5000.0)
    pool = parse_pool("1x llama3-8b-h100 + 1x llama3-8b-h100@stall-every-s=3,stall-ms=1500:1500")
    policy = BUILTIN_POLICIES["round-robin"]
    outcome = {}
    for stall_ms in (None, 200.0):
        deadlines = Deadlines(DEFAULT_DEADLINES.objectives, HedgingConfig(stall_ms=stall_ms, burst=50))
        with ClusterSimulator(pool, policy, use_predictor=False, deadlines=deadlines) as sim:
            rec = sim.run(requests)
            assert _idle(sim)
        assert np.all(rec.status == OK)
        outcome[stall_ms] = (rec.facts["slo_actions"]["hedges"].get("sent", 0), np.max(rec.ttft_s))
    assert outcome[None][0] == 0 and outcome[None][1] > 1.0  # caught in a pause, waited it out
    sent, worst_s = outcome[200.0]
    assert sent > 0 and worst_s < 0.5  # hedged within about 200 ms (+ a 100 ms look) of a pause's start
