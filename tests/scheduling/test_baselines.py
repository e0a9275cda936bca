from __future__ import annotations

import numpy as np

from slorouter.scheduling.plugins.pickers import RoundRobinPicker
from slorouter.scheduling.plugins.scorers import LeastRequestScorer
from slorouter.scheduling.types import CycleState
from tests.helpers.scheduling import addresses, candidates_of, make_ctx, make_pool, make_request


def test_round_robin_cycles_in_pool_order_and_skips_missing_candidates() -> None:
    pool = make_pool(4)
    picker = RoundRobinPicker("rr", RoundRobinPicker.Params(), make_ctx(pool=pool))
    request, cycle = make_request(), CycleState()
    every = candidates_of(pool)
    picks = [int(every.positions[picker.pick(cycle, request, every, np.zeros(4))[0]]) for _ in range(6)]
    assert picks == [0, 1, 2, 3, 0, 1]
    without_2 = every.subset(np.array([0, 1, 3]))  # endpoint 2 filtered out: the turn passes to 3
    assert int(without_2.positions[picker.pick(cycle, request, without_2, np.zeros(3))[0]]) == 3
    assert int(every.positions[picker.pick(cycle, request, every, np.zeros(4))[0]]) == 0


def test_round_robin_several_endpoints_wrap_around() -> None:
    pool = make_pool(3)
    params = RoundRobinPicker.Params.model_validate({"maxNumOfEndpoints": 2})
    picker = RoundRobinPicker("rr", params, make_ctx(pool=pool))
    every = candidates_of(pool)
    assert every.positions[picker.pick(CycleState(), make_request(), every, np.zeros(3))].tolist() == [0, 1]
    assert every.positions[picker.pick(CycleState(), make_request(), every, np.zeros(3))].tolist() == [1, 2]


def test_least_request_scorer_reads_router_local_inflight_requests() -> None:
    pool = make_pool(3, running=[0, 50, 100])  # scraped load must not matter
    for address, count in zip(addresses(3), (4, 0, 2), strict=True):
        pool.add_inflight(address, count, 0, 0)
    scorer = LeastRequestScorer("lr", LeastRequestScorer.Params(), make_ctx(pool=pool))
    scores = scorer.score(CycleState(), make_request(), candidates_of(pool))
    np.testing.assert_allclose(scores, [0.0, 1.0, 0.5])
