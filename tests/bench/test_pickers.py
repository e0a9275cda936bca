"""Several picker replicas in the discrete-event cluster: the split of traffic, each picker's own view, the
shared in-flight view, and one picker exactly as before pickers existed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import BUILTIN_POLICIES, NAMED_POLICIES
from slorouter.bench.pool import parse_pool
from slorouter.bench.records import OK, RunRecords
from slorouter.bench.workloads import BenchRequest
from slorouter.cli import main
from tests.helpers.bench_requests import chat_requests

_ARRAYS = ("status", "pod", "ttft_s", "e2e_s", "cached_tokens", "predicted_ttft_ms", "point_tpot_ms")


def _same(a: RunRecords, b: RunRecords) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k), equal_nan=True) for k in _ARRAYS) and (
        a.steps,
        a.events,
        a.trainings,
    ) == (b.steps, b.events, b.trainings)


def test_one_picker_ignores_every_picker_setting() -> None:
    """With one picker nothing is drawn, published or scheduled for pickers: the run is the plain one."""
    requests = chat_requests(600, qps=60, seed=5)
    settings = ClusterSettings(min_samples=100, retrain_interval_s=2.0, train_poll_s=0.5)
    other = ClusterSettings(
        min_samples=100,
        retrain_interval_s=2.0,
        train_poll_s=0.5,
        pickers=1,
        picker_assignment="round-robin",
        shared_inflight=True,
        shared_inflight_interval_s=0.001,
    )
    runs = []
    for s in (settings, other):
        policy = BUILTIN_POLICIES["predicted-latency"]
        with ClusterSimulator(parse_pool("3"), policy, use_predictor=True, settings=s, seed=2) as sim:
            runs.append(sim.run(requests))
            assert len(sim.pickers) == 1 and sim.board is None
    assert _same(*runs)
    assert runs[0].trainings > 0 and np.all(runs[0].picker == 0)
    assert "pickers" not in runs[0].facts


@pytest.mark.parametrize("assignment", ["random", "round-robin"])
def test_two_pickers_split_the_traffic(assignment: str) -> None:
    requests = chat_requests(400, qps=40)
    settings = ClusterSettings(pickers=2, picker_assignment=assignment)
    with ClusterSimulator(
        parse_pool("4"), BUILTIN_POLICIES["heuristic"], use_predictor=False, settings=settings
    ) as sim:
        rec = sim.run(requests)
        for stack in sim.pickers:  # every request released by the picker that dispatched it
            assert stack.tracker.outstanding() == 0
            assert np.all(stack.pool.columns["inflight_requests"] == 0)
    assert np.all(rec.status == OK) and rec.facts["pickers"] == 2
    counts = np.bincount(rec.picker, minlength=2)
    if assignment == "round-robin":
        assert rec.picker.tolist() == [0, 1] * 200
    else:
        assert 150 < counts[0] < 250 and counts.sum() == 400
        assert rec.picker.tolist() != [0, 1] * 200
    with ClusterSimulator(
        parse_pool("4"), BUILTIN_POLICIES["heuristic"], use_predictor=False, settings=settings
    ) as sim:
        assert np.array_equal(sim.run(requests).picker, rec.picker)  # the draw is seeded


def _run_watched(settings: ClusterSettings, policy: str = "least-request") -> list[tuple[list[int], ...]]:
    requests = chat_requests(1200, qps=120, seed=1)
    seen: list[tuple[list[int], list[int], list[int]]] = []
    with ClusterSimulator(
        parse_pool("4"), BUILTIN_POLICIES[policy], use_predictor=False, settings=settings
    ) as sim:

        def progress(now: float) -> None:
            outstanding = [stack.tracker.outstanding() for stack in sim.pickers]
            columns = [int(stack.pool.columns["inflight_requests"].sum()) for stack in sim.pickers]
            own = [
                sum(c[0] for c in stack.shared.own().values()) if stack.shared else columns[k]
                for k, stack in enumerate(sim.pickers)
            ]
            seen.append((outstanding, columns, own))

        rec = sim.run(requests, progress=progress)
        for stack in sim.pickers:
            assert stack.tracker.outstanding() == 0
            for column in ("inflight_requests", "inflight_prefill_tokens", "inflight_decode_tokens"):
                assert np.all(stack.pool.columns[column] == 0)
    assert np.all(rec.status == OK)
    return seen


def test_split_views_count_only_the_pickers_own_requests() -> None:
    seen = _run_watched(ClusterSettings(pickers=3))
    assert len(seen) > 5
    for outstanding, columns, _ in seen:
        assert columns == outstanding  # exactly its own requests, nobody else's
    assert any(min(o) > 0 for o, _, _ in seen)  # and every picker had some while the others did too


@pytest.mark.parametrize(
    "settings",
    [
        ClusterSettings(pickers=3, shared_inflight=True),  # on change, 2 ms later
        ClusterSettings(
            pickers=3,
            shared_inflight=True,
            shared_inflight_publishing="periodic",
            shared_inflight_interval_s=0.005,
            shared_inflight_delay_s=0.005,
        ),
    ],
    ids=["on-change", "periodic"],
)
def test_shared_view_adds_the_other_pickers_published_counts(settings: ClusterSettings) -> None:
    seen = _run_watched(settings)
    grew = 0
    for outstanding, columns, own in seen:
        assert own == outstanding  # own counts are the tracker's, fresh
        total = sum(outstanding)
        for k, column in enumerate(columns):
            assert column >= own[k]
            others = column - own[k]
            # the others' latest publications: near their current counts (a few ms stale)
            assert abs(others - (total - outstanding[k])) <= max(6, 0.3 * total)
            grew += others > 0
    assert grew > len(seen)  # the others' load was there most of the time


def test_shared_view_brings_least_request_back_to_one_pickers_balance() -> None:
    """Long requests 20 ms apart: least-request with one picker spreads them evenly; split pickers each spread
    only their own, so the pods end up uneven; sharing (10 ms stale at most) is even again."""
    requests = [BenchRequest(arrival=0.02 * i, prompt="q" * 400, max_tokens=2000) for i in range(80)]
    imbalance = {}
    for name, settings in (
        ("one", ClusterSettings()),
        ("split", ClusterSettings(pickers=4)),
        ("shared", ClusterSettings(pickers=4, shared_inflight=True)),
    ):
        policy = BUILTIN_POLICIES["least-request"]
        with ClusterSimulator(parse_pool("4"), policy, use_predictor=False, settings=settings) as sim:
            rec = sim.run(requests)
        assert np.all(rec.status == OK)
        counts = np.bincount(rec.pod, minlength=4)
        imbalance[name] = int(counts.max() - counts.min())
    assert imbalance["one"] == 0 and imbalance["shared"] == 0
    assert imbalance["split"] >= 2


def test_each_picker_trains_its_own_predictor_on_its_share() -> None:
    requests = chat_requests(1500, qps=50, seed=3)
    settings = ClusterSettings(min_samples=100, retrain_interval_s=2.0, train_poll_s=0.5, pickers=2)
    policy = BUILTIN_POLICIES["predicted-latency"]
    with ClusterSimulator(parse_pool("4"), policy, use_predictor=True, settings=settings) as sim:
        rec = sim.run(requests)
        predictors = [stack.predictor for stack in sim.pickers]
        assert predictors[0] is not predictors[1]
        samples = [p.trainer.status()["models"]["ttft"]["samples"] for p in predictors if p is not None]
        assert all(v is not None for p in predictors if p is not None for v in p.versions.values())
    assert np.all(rec.status == OK)
    assert rec.predicted[rec.arrival > rec.arrival[-1] * 0.5].mean() > 0.9
    share = np.bincount(rec.picker, minlength=2) / len(rec.picker)
    assert samples[0] / sum(samples) == pytest.approx(share[0], abs=0.05)


def test_a_shared_predictor_trains_on_every_pickers_samples() -> None:
    requests = chat_requests(800, qps=50, seed=3)
    policy = BUILTIN_POLICIES["predicted-latency"]
    samples = {}
    for shared in (False, True):
        settings = ClusterSettings(
            min_samples=100, retrain_interval_s=2.0, train_poll_s=0.5, pickers=3, shared_predictor=shared
        )
        with ClusterSimulator(parse_pool("4"), policy, use_predictor=True, settings=settings) as sim:
            rec = sim.run(requests)
            predictors = {id(stack.predictor): stack.predictor for stack in sim.pickers}
            assert len(predictors) == (1 if shared else 3)
            samples[shared] = [p.store.total_added("ttft") for p in predictors.values() if p is not None]
        assert rec.trainings > 0 and len(set(rec.picker[rec.predicted].tolist())) == 3
    (together,) = samples[True]
    assert together == sum(samples[False]) == len(requests)  # every finished request once
    assert together > 2 * max(samples[False])


def test_precise_prefix_pickers_each_get_every_kv_event() -> None:
    requests = chat_requests(300, qps=30)
    policy = NAMED_POLICIES["heuristic-precise"]
    settings = ClusterSettings(pickers=2)
    with ClusterSimulator(
        parse_pool("3"), policy, use_predictor=False, kv_events=True, settings=settings
    ) as sim:
        sim.run(requests)
        first, second = (stack.kv_index for stack in sim.pickers)
        assert first is not None and second is not None and first is not second
        for address in sim.addresses:
            assert first.pod_stats(address).batches > 0
            assert first.pod_stats(address) == second.pod_stats(address)
            assert first.num_blocks(address) == second.num_blocks(address) > 0


def test_picker_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="pickers must be >= 1"):
        ClusterSettings(pickers=0)
    with pytest.raises(ValueError, match="picker_assignment"):
        ClusterSettings(picker_assignment="hash")
    with pytest.raises(ValueError, match="shared_inflight_publishing"):
        ClusterSettings(shared_inflight_publishing="sometimes")
    with pytest.raises(ValueError, match="shared_inflight_ttl_s must exceed"):
        ClusterSettings(shared_inflight_interval_s=0.1, shared_inflight_ttl_s=0.1)


def test_bench_command_takes_pickers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["bench", "--workload", "shared-prefix-a", "--pool", "2", "--qps", "6", "--duration", "15"]
    base += ["--warmup", "3", "--policies", "least-request", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    assert main([*base, "--out", str(tmp_path / "two"), "--pickers", "2", "--shared-inflight"]) == 0
    (one,) = json.loads((tmp_path / "one" / "results.json").read_text())["runs"]
    (two,) = json.loads((tmp_path / "two" / "results.json").read_text())["runs"]
    assert "pickers" not in one and "picker_shares" not in one  # one picker: the JSON as before
    assert two["pickers"] == 2 and two["shared_inflight"] is True and two["picker_assignment"] == "random"
    assert sum(two["picker_shares"]) == pytest.approx(1.0, abs=1e-3)
    assert "2 pickers sharing in-flight counts" in (tmp_path / "two" / "results.md").read_text()
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "bad"), "--shared-inflight"]) == 2
    assert "--shared-inflight needs --pickers 2 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--pickers", "0"])
