"""Lost KV-event batches in the discrete-event cluster: each gap clears the pod; with the trust states the
pod rebuilds on the approximate estimate, without them its index is used at once."""

from __future__ import annotations

import pytest

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import NAMED_POLICIES
from slorouter.bench.pool import parse_pool
from slorouter.cli import main
from slorouter.pool.kv_trust import TrustReason, TrustState, TrustThresholds
from tests.helpers.bench_requests import chat_requests

REBUILDING = (TrustState.REBUILDING, TrustReason.UNRECOVERED_GAP)


def run(drop: float, trust: bool) -> ClusterSimulator:
    settings = ClusterSettings(kv_event_drop=drop, kv_trust=TrustThresholds() if trust else None)
    sim = ClusterSimulator(
        parse_pool("3"),
        NAMED_POLICIES["heuristic-precise"],
        use_predictor=False,
        kv_events=True,
        settings=settings,
    )
    with sim:
        sim.run(chat_requests(200, qps=20))
    return sim


def transitions(sim: ClusterSimulator, address: str) -> int:
    assert sim.kv_index is not None
    trust = sim.kv_index.trust.get(address)
    return 0 if trust is None else trust.transitions[REBUILDING]


def test_lost_batches_clear_the_pod_and_with_trust_it_rebuilds() -> None:
    sim = run(0.2, trust=True)
    assert sum(transitions(sim, address) for address in sim.addresses) > 0


def test_without_trust_a_cleared_pod_stays_exact_and_without_drops_nothing_is_cleared() -> None:
    for sim in (run(0.2, trust=False), run(0.0, trust=True)):
        assert sum(transitions(sim, address) for address in sim.addresses) == 0
        assert sim.kv_index is not None and all(sim.kv_index.trusted(a) for a in sim.addresses)


def test_the_same_seed_loses_the_same_batches() -> None:
    first, second = run(0.3, trust=True), run(0.3, trust=True)
    assert first.kv_index is not None and second.kv_index is not None
    for address in first.addresses:
        assert first.kv_index.pod_stats(address) == second.kv_index.pod_stats(address)


def test_bad_drop_shares_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"kv_event_drop must be in \[0, 1\)"):
        ClusterSettings(kv_event_drop=1.0)
    with pytest.raises(SystemExit):
        main(["bench", "--kv-event-drop", "1"])
    assert "--kv-event-drop: must be below 1 (a share of the batches), got '1'" in capsys.readouterr().err
