"""The overload scenarios: burst arrival counts, tenant and priority mixes, determinism."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from slorouter.bench.policies import PolicyError, load_flow_control_file, resolve_policies, resolve_policy
from slorouter.bench.workloads import generate


def _count(requests: list, start: float, end: float) -> int:  # type: ignore[type-arg]
    arrivals = np.array([r.arrival for r in requests])
    return int(((arrivals >= start) & (arrivals < end)).sum())


def test_burst_raises_the_rate_in_its_window_only() -> None:
    params = {"burst_qps": 300, "burst_start_s": 40, "burst_s": 40, "critical_share": 0, "sheddable_share": 0}
    burst = generate("sharegpt-burst", qps=100, duration_s=120, seed=0, params=params)
    steady_params = {**params, "burst_qps": "none"}
    steady = generate("sharegpt-burst", qps=100, duration_s=120, seed=0, params=steady_params)
    assert _count(burst, 40, 80) == pytest.approx(300 * 40, rel=0.05)
    assert _count(burst, 0, 40) == _count(steady, 0, 40)  # before the window: the base workload's own
    assert _count(burst, 80, 120) == pytest.approx(100 * 40, rel=0.07)
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(burst))
    assert max(r.arrival for r in burst) < 120


def test_maas_burst_is_steady_outside_the_burst() -> None:
    requests = generate("maas-burst", qps=150, duration_s=150, seed=1)
    counts = [_count(requests, s, s + 30) for s in range(0, 150, 30)]
    assert counts[2] == pytest.approx(450 * 30, rel=0.05) and counts[3] == pytest.approx(450 * 30, rel=0.05)
    for c in (counts[0], counts[1], counts[4]):
        assert c == pytest.approx(150 * 30, rel=0.07)


def test_priority_mix_is_20_50_30() -> None:
    requests = generate("mixed-priority", qps=100, duration_s=100, seed=2)
    shares = {p: n / len(requests) for p, n in Counter(r.priority for r in requests).items()}
    assert shares[1] == pytest.approx(0.2, abs=0.015)
    assert shares[0] == pytest.approx(0.5, abs=0.015)
    assert shares[-1] == pytest.approx(0.3, abs=0.015)
    assert all(r.slo_ttft_ms == 1000.0 for r in requests)


def test_two_tenants_heavy_sends_ten_times_light_and_light_alone_is_its_share() -> None:
    both = generate("two-tenants", qps=110, duration_s=120, seed=0)
    counts = Counter(r.tenant for r in both)
    assert counts["heavy"] / counts["light"] == pytest.approx(10, rel=0.25)
    tenant_of: dict[int, str] = {}
    for r in both:
        if r.session >= 0:
            assert tenant_of.setdefault(r.session, r.tenant) == r.tenant  # a session keeps its tenant
    light = generate("two-tenants", qps=110, duration_s=120, seed=0, params={"tenants": "light"})
    assert list(light) == [r for r in both if r.tenant == "light"]
    assert {r.priority for r in both} == {0}


def test_same_seed_same_requests_other_seed_others() -> None:
    window = {"burst_start_s": 20, "burst_s": 20}
    first = generate("sharegpt-burst", qps=50, duration_s=60, seed=4, params=window)
    again = generate("sharegpt-burst", qps=50, duration_s=60, seed=4, params=window)
    other = generate("sharegpt-burst", qps=50, duration_s=60, seed=5, params=window)
    assert list(first) == list(again)
    assert list(first) != list(other)


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"critical_share": 0.8, "sheddable_share": 0.3}, "must not exceed 1"),
        ({"tenants": "light"}, "needs heavy_tenant_ratio"),
        ({"tenants": "nobody"}, "tenants"),
    ],
)
def test_bad_parameters_name_the_problem(params: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        generate("mixed-priority", qps=10, duration_s=10, seed=0, params=params)  # type: ignore[arg-type]


def test_fc_policies_are_the_same_pipeline_behind_flow_control() -> None:
    plain, behind = resolve_policy("token-aware"), resolve_policy("token-aware+fc")
    assert behind.name == "token-aware+fc" and behind.config == plain.config
    assert plain.flow_control is None
    assert behind.flow_control is not None and behind.flow_control.enabled
    names = [p.name for p in resolve_policies(["heuristic", "token-aware+fc"], with_flow_control=True)]
    assert names == ["heuristic", "heuristic+fc", "token-aware+fc"]


def test_flow_control_file_sets_the_fc_policies_section(tmp_path: Path) -> None:
    path = tmp_path / "fc.yaml"
    path.write_text("flowControl:\n  saturationDetector: {prefillTargetTime: 250ms}\n")
    section = load_flow_control_file(path)
    assert section.enabled and section.saturation_detector.prefill_target_s == 0.25
    (policy,) = resolve_policies(["token-aware+fc"], flow_control=section)
    assert policy.flow_control is section
    path.write_text("flowControl:\n  saturationDetector: {prefillTargetTime: -1}\n")
    with pytest.raises(PolicyError, match="prefillTargetTime"):
        load_flow_control_file(path)
