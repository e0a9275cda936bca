"""Flow control in the discrete-event benchmark: the same layer, in virtual time."""

from __future__ import annotations

import numpy as np
import pytest

from slorouter.bench.classes import class_figures
from slorouter.bench.cluster import ClusterSimulator
from slorouter.bench.policies import BUILTIN_POLICIES
from slorouter.bench.pool import parse_pool
from slorouter.bench.records import OK, SHED
from slorouter.bench.workloads import BenchRequest
from slorouter.flowcontrol.config import FlowControlConfig


def _burst(n: int, qps: float, seed: int = 0) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / qps, n))
    priorities = rng.choice([1, 0, -1], size=n, p=[0.2, 0.5, 0.3])
    return [
        BenchRequest(float(t), f"{i:05d}" * int(rng.integers(1000, 3000)), int(rng.integers(100, 400)),
                     priority=int(p), slo_ttft_ms=2000.0, tenant=f"t{i % 2}")
        for i, (t, p) in enumerate(zip(arrivals, priorities, strict=True))
    ]  # fmt: skip


def _run(flow: FlowControlConfig | None, requests: list[BenchRequest]) -> object:
    with ClusterSimulator(
        parse_pool("2"), BUILTIN_POLICIES["heuristic"], use_predictor=False, flow_control=flow
    ) as sim:
        records = sim.run(requests)
        for stack in sim.pickers:
            controller = stack.director.flow_control
            assert controller is None or (len(controller) == 0 and controller.reserved == 0)
        assert sim.tracker.outstanding() == 0
        return records


def test_overload_is_held_in_the_router_and_served_by_priority() -> None:
    requests = _burst(600, qps=60.0)
    flow = FlowControlConfig.model_validate(
        {
            "enabled": True,
            "defaultRequestTTL": "60s",
            "saturationDetector": {"maxInflightPrefillTokensPerEndpoint": 16000},
        }
    )
    records = _run(flow, requests)
    status = records.status  # type: ignore[attr-defined]
    assert set(np.unique(status).tolist()) <= {OK, SHED, 503}
    priority = np.array([r.priority for r in requests])
    ttft = records.ttft_s  # type: ignore[attr-defined]
    critical = np.nanpercentile(ttft[(priority == 1) & (status == OK)], 90)
    sheddable_ok = ttft[(priority == -1) & (status == OK)]
    assert (status[priority >= 0] != SHED).all()  # no limit is set: only sheddable requests are turned away
    assert sheddable_ok.size == 0 or critical < np.nanpercentile(sheddable_ok, 90)
    baseline = _run(None, requests)
    base_ttft = baseline.ttft_s  # type: ignore[attr-defined]
    assert critical < np.nanpercentile(base_ttft[priority == 1], 90)


def test_same_seed_same_run_with_flow_control() -> None:
    requests = _burst(200, qps=40.0, seed=3)
    flow = FlowControlConfig.model_validate({"enabled": True})
    first = _run(flow, requests)
    second = _run(flow, requests)
    assert np.array_equal(first.status, second.status)  # type: ignore[attr-defined]
    assert np.allclose(first.ttft_s, second.ttft_s, equal_nan=True)  # type: ignore[attr-defined]


def test_the_derived_prefill_bound_engages_under_prefill_bound_overload() -> None:
    requests = _burst(600, qps=60.0)
    flow = FlowControlConfig.model_validate({"enabled": True, "defaultRequestTTL": "60s"})
    with ClusterSimulator(
        parse_pool("2"), BUILTIN_POLICIES["heuristic"], use_predictor=False, flow_control=flow
    ) as sim:
        records = sim.run(requests)
        detector = sim.director.flow_control.detector  # type: ignore[union-attr]
        assert all(detector.prefill_bound(address) is not None for address in sim.addresses)
    priority = np.array([r.priority for r in requests])
    # Held in the router: sheddable requests waited past their SLO and were evicted; no other was.
    assert (records.status[priority < 0] == SHED).sum() > 0
    assert (records.status[priority >= 0] != SHED).all()


def test_class_figures_split_the_ttft_into_queue_and_pod() -> None:
    requests = _burst(600, qps=60.0)
    flow = FlowControlConfig.model_validate({"enabled": True, "defaultRequestTTL": "60s"})
    records = _run(flow, requests)
    queued = records.queued_s  # type: ignore[attr-defined]
    served = ~np.isnan(records.ttft_s)  # type: ignore[attr-defined]
    assert (queued[served] >= 0).all() and (queued[served] > 0).any()
    assert (queued[served] <= records.ttft_s[served]).all()  # type: ignore[attr-defined]
    figures = class_figures(records, requests, warmup_s=0.0, duration_s=1e9)  # type: ignore[arg-type]
    critical = (np.array([r.priority for r in requests]) == 1) & served
    split = np.nan_to_num(queued[critical])
    assert figures["critical_queued_p99_ms"] == pytest.approx(
        np.percentile(split, 99, method="higher") * 1000, abs=1e-3
    )
    pod = records.ttft_s[critical] - split  # type: ignore[attr-defined]
    assert figures["critical_pod_ttft_p99_ms"] == pytest.approx(
        np.percentile(pod, 99, method="higher") * 1000, abs=1e-3
    )
    assert "tenant_t0_queued_p90_ms" in figures and "tenant_t1_pod_ttft_p90_ms" in figures
    without = _run(None, requests)
    assert (without.queued_s[~np.isnan(without.ttft_s)] == 0).all()  # type: ignore[attr-defined]


def test_requests_held_after_the_last_arrival_still_drain_on_fresh_scrapes() -> None:
    # Any KV use closes an endpoint: the queue drains only as new scrapes show the pods emptying, which
    # must go on after the last arrival while requests are held.
    requests = [BenchRequest(0.05 * i, f"{i:05d}" * 400, 64, slo_ttft_ms=60_000.0) for i in range(20)]
    flow = FlowControlConfig.model_validate(
        {"enabled": True, "defaultRequestTTL": "60s", "saturationDetector": {"kvCacheUtilThreshold": 0.001}}
    )
    records = _run(flow, requests)
    assert (records.status == OK).all()  # type: ignore[attr-defined]
    assert np.nanmax(records.queued_s) > 0  # type: ignore[attr-defined]
