"""The discrete-event cluster simulator: physics against the engine, accounting, determinism, training."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import BUILTIN_POLICIES
from slorouter.bench.pool import parse_pool
from slorouter.bench.records import OK, SHED, UNFINISHED
from slorouter.bench.workloads import BenchRequest
from slorouter.predictor.ledger import LedgerSettings
from slorouter.sim.engine import Engine
from slorouter.sim.profiles import get_profile
from tests.helpers.bench_requests import chat_requests


def test_a_lone_request_sees_the_engines_latency_plus_the_network() -> None:
    profile = get_profile("llama3-8b-h100")
    request = BenchRequest(arrival=1.0, prompt="p" * (4 * 2000), max_tokens=50)
    settings = ClusterSettings(network_s=0.002, jitter_sigma=0.0)
    with ClusterSimulator([profile], None, use_predictor=False, settings=settings) as sim:
        rec = sim.run([request])
    engine = Engine(profile, jitter_sigma=0.0)
    engine.add_request(0, request.prompt.encode(), 50, 1.0 + 0.002)
    now, first, done = 1.002, None, None
    while done is None:
        step = engine.plan_step(now)
        if step is None:
            now = engine.next_ready_time()
            continue
        out = engine.commit_step(step)
        now = step.end
        first = first or (out.first_tokens[0].time if out.first_tokens else None)
        done = out.finished[0].done_time if out.finished else None
    assert rec.status[0] == OK and rec.pod[0] == 0 and rec.output_tokens[0] == 50
    assert rec.ttft_s[0] == pytest.approx(first + 0.002 - 1.0, abs=1e-9)
    assert rec.e2e_s[0] == pytest.approx(done + 0.002 - 1.0, abs=1e-9)
    assert rec.prompt_tokens[0] == 2000


def test_every_request_finishes_once_and_nothing_leaks() -> None:
    requests = chat_requests(400, qps=40)
    with ClusterSimulator(parse_pool("4"), BUILTIN_POLICIES["heuristic"], use_predictor=False) as sim:
        rec = sim.run(requests)
        assert sim.tracker.outstanding() == 0
        assert np.all(sim.pool.columns["inflight_requests"] == 0)
        assert np.all(sim.pool.columns["inflight_prefill_tokens"] == 0)
        assert np.all(sim.pool.columns["inflight_decode_tokens"] == 0)
    assert np.all(rec.status == OK)
    assert np.all(rec.ttft_s > 0) and np.all(rec.e2e_s >= rec.ttft_s)
    assert np.array_equal(rec.output_tokens, [r.max_tokens for r in requests])
    assert rec.facts["leaked_inflight"] == 0
    assert set(np.unique(rec.pod)) == {0, 1, 2, 3}  # the load was spread
    assert rec.cached_tokens.sum() > 0  # the shared system prompts hit the prefix cache


def test_same_seed_same_run_other_seed_other_jitter() -> None:
    requests = chat_requests(200, qps=30)
    policy = BUILTIN_POLICIES["heuristic-tuned"]

    def run(seed: int) -> np.ndarray:
        with ClusterSimulator(parse_pool("3"), policy, use_predictor=False, seed=seed) as sim:
            return sim.run(requests).e2e_s

    first = run(1)
    np.testing.assert_array_equal(first, run(1))
    assert not np.array_equal(first, run(2))


def test_unfinished_requests_are_released_and_marked() -> None:
    requests = [BenchRequest(arrival=0.0, prompt="x" * 400, max_tokens=5000)]
    settings = ClusterSettings(drain_s=1.0)
    with ClusterSimulator(parse_pool("1"), None, use_predictor=False, settings=settings) as sim:
        rec = sim.run(requests)
        assert sim.tracker.outstanding() == 0
    assert rec.status[0] == UNFINISHED and not math.isnan(rec.ttft_s[0]) and math.isnan(rec.e2e_s[0])


def test_round_robin_and_least_request_policies_route_as_named() -> None:
    requests = chat_requests(12, qps=1000)  # a burst: nothing finishes in between
    with ClusterSimulator(parse_pool("4"), BUILTIN_POLICIES["round-robin"], use_predictor=False) as sim:
        rec = sim.run(requests)
    assert rec.pod.tolist() == [0, 1, 2, 3] * 3
    with ClusterSimulator(parse_pool("4"), BUILTIN_POLICIES["least-request"], use_predictor=False) as sim:
        rec = sim.run(requests)
    assert np.bincount(rec.pod, minlength=4).tolist() == [3, 3, 3, 3]


def test_predicted_latency_trains_online_and_then_routes_by_prediction() -> None:
    requests = chat_requests(1500, qps=50, seed=3)
    settings = ClusterSettings(min_samples=100, retrain_interval_s=2.0, train_poll_s=0.5)
    policy = BUILTIN_POLICIES["predicted-latency"]
    with ClusterSimulator(parse_pool("4"), policy, use_predictor=True, settings=settings) as sim:
        rec = sim.run(requests)
        versions = sim.predictor.versions  # type: ignore[union-attr]
    assert rec.trainings >= 4 and versions["ttft"] is not None and versions["tpot"] is not None
    assert not rec.predicted[:50].any()  # warm-up: heuristics until the first model
    late = rec.arrival > rec.arrival[-1] * 0.5
    assert rec.predicted[late].mean() > 0.95
    served = late & rec.predicted
    actual = rec.ttft_s[served] * 1000
    assert np.all(rec.point_ttft_ms[served] < rec.predicted_ttft_ms[served])  # point below its p90
    assert 0.6 <= float(np.mean(actual <= rec.predicted_ttft_ms[served])) <= 1.0
    assert np.all(rec.status == OK)


def test_the_ledger_pairs_the_simulated_outcomes_and_a_distrusted_pool_routes_by_heuristics() -> None:
    requests = chat_requests(1500, qps=50, seed=3)
    # A band no model meets, and a fallback at once: the pool is distrusted soon after the first model.
    ledger = LedgerSettings(coverage_low=0.0, coverage_high=0.01, min_outcomes=20, drift_after_s=2.0,
                            fallback_after_s=0.0, check_interval_s=0.5)  # fmt: skip
    settings = ClusterSettings(min_samples=100, retrain_interval_s=2.0, train_poll_s=0.5, ledger=ledger)
    policy = BUILTIN_POLICIES["predicted-latency"]
    with ClusterSimulator(parse_pool("4"), policy, use_predictor=True, settings=settings) as sim:
        rec = sim.run(requests)
        book = sim.pickers[0].ledger
        assert book is not None
        summary = book.summary()
    assert summary.drifts >= 1 and summary.distrusted
    assert sum(kinds["ttft"].outcomes for kinds in summary.endpoints.values()) > 0
    late = rec.arrival > rec.arrival[-1] * 0.8
    assert not rec.predicted[late].any()  # routed by the heuristic profile, not by the distrusted model
    assert np.all(rec.status == OK)


def test_sheddable_requests_that_cannot_meet_their_slo_are_shed() -> None:
    requests = [  # 1 ms TTFT: unattainable; long answers keep both pods busy and their KV caches warm
        BenchRequest(r.arrival, r.prompt, 800, slo_ttft_ms=1.0, priority=-1)
        for r in chat_requests(1000, qps=40, seed=4)
    ]
    settings = ClusterSettings(min_samples=100, retrain_interval_s=2.0, train_poll_s=0.5)
    policy = BUILTIN_POLICIES["predicted-latency"]
    with ClusterSimulator(parse_pool("2"), policy, use_predictor=True, settings=settings) as sim:
        rec = sim.run(requests)
        assert sim.tracker.outstanding() == 0
    late = rec.arrival > rec.arrival[-1] * 0.6
    # Once trained, only requests to idle or cold pods pass the admitter; most are shed with 429.
    assert (rec.status[late] == SHED).mean() > 0.5
    assert np.all((rec.status == OK) | (rec.status == SHED))
    assert np.all(rec.pod[rec.status == SHED] == -1)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="scrape_interval_s"):
        ClusterSettings(scrape_interval_s=0)
    with pytest.raises(ValueError, match="network_s"):
        ClusterSettings(network_s=-1)
    with (
        pytest.raises(ValueError, match="sorted"),
        ClusterSimulator(parse_pool("1"), None, use_predictor=False) as sim,
    ):
        sim.run([BenchRequest(2.0, "a" * 8, 1), BenchRequest(1.0, "a" * 8, 1)])


def _scraped(pool_spec: str, requests: list[BenchRequest]) -> list[tuple[float, str, float, int]]:
    """(time, address, KV usage, running) of every scrape the router saw."""
    seen: list[tuple[float, str, float, int]] = []
    with ClusterSimulator(parse_pool(pool_spec), BUILTIN_POLICIES["heuristic"], use_predictor=False) as sim:
        set_metrics = sim.pool.set_metrics

        def record(address: str, snapshot: object, at: float) -> None:
            seen.append((at, address, snapshot.kv_usage, snapshot.running))  # type: ignore[attr-defined]
            set_metrics(address, snapshot, at)  # type: ignore[arg-type]

        sim.pool.set_metrics = record  # type: ignore[method-assign]
        sim.run(requests)
    return seen


def test_coarse_metrics_variant_rounds_kv_usage_and_updates_once_a_second() -> None:
    seen = _scraped("2@coarse-metrics,kv-blocks=2048", chat_requests(300, qps=30))
    assert any(kv > 0 for _, _, kv, _ in seen)
    assert all(abs(kv * 10 - round(kv * 10)) < 1e-9 for _, _, kv, _ in seen)
    for address in {a for _, a, _, _ in seen}:
        shown = [(int(t + 1e-9), kv, running) for t, a, kv, running in seen if a == address]
        per_second: dict[int, set[tuple[float, int]]] = {}
        for second, kv, running in shown:
            per_second.setdefault(second, set()).add((kv, running))
        assert all(len(values) == 1 for values in per_second.values())
        assert len({values.pop() for values in per_second.values()}) > 1


def test_late_metrics_variant_shows_the_pods_half_a_second_late() -> None:
    requests = chat_requests(200, qps=50)
    first_arrival = requests[0].arrival
    live = [t for t, _, _, running in _scraped("2", requests) if running]
    late = [t for t, _, _, running in _scraped("2@late-metrics", requests) if running]
    assert min(live) < first_arrival + 0.1
    assert min(late) == pytest.approx(min(live) + 0.5, abs=0.051)


def test_with_engine_priority_each_requests_priority_reaches_a_priority_queue_pod() -> None:
    # One pod with one seat: a long request holds it while the others queue; the pod serves them by their
    # priority (higher first: vLLM gets it negated), not by arrival; without engine priority, by arrival.
    blocker = BenchRequest(arrival=0.0, prompt="b" * 400, max_tokens=100)
    queued = [
        BenchRequest(arrival=0.01 * (i + 1), prompt=f"{i}" * 400, max_tokens=2, priority=priority)
        for i, priority in enumerate([-5, -1, -5, 3])
    ]
    for engine_priority, order in ((True, [0, 4, 2, 1, 3]), (False, [0, 1, 2, 3, 4])):
        pool = parse_pool("1@priority-queue,max-seqs=1")
        with ClusterSimulator(pool, None, use_predictor=False, engine_priority=engine_priority) as sim:
            rec = sim.run([blocker, *queued])
        assert np.all(rec.status == OK)
        done = rec.arrival + rec.e2e_s
        assert list(np.argsort(done)) == order


def test_stalling_pods_are_deterministic_per_seed_and_slow_the_tail() -> None:
    requests = chat_requests(300, qps=30)
    policy = BUILTIN_POLICIES["heuristic-tuned"]

    def run(pool: str, seed: int) -> np.ndarray:
        with ClusterSimulator(parse_pool(pool), policy, use_predictor=False, seed=seed) as sim:
            rec = sim.run(requests)
        assert np.all(rec.status == OK)
        return rec.e2e_s

    stalling = run("3@stall-every-s=2,stall-ms=300:600", 1)
    np.testing.assert_array_equal(stalling, run("3@stall-every-s=2,stall-ms=300:600", 1))
    assert not np.array_equal(stalling, run("3@stall-every-s=2,stall-ms=300:600", 2))
    assert np.percentile(stalling, 99) > np.percentile(run("3", 1), 99) + 0.2
