"""Running a benchmark plan: every workload × load × policy on the same pool, seed and arrivals."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slorouter.bench.classes import class_figures
from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import Policy
from slorouter.bench.pool import describe_pool
from slorouter.bench.records import RunRecords
from slorouter.bench.results import summarize_run
from slorouter.bench.workloads import generate
from slorouter.bench.workloads.trace import Replay
from slorouter.sim.profiles import Profile


@dataclass(frozen=True, slots=True)
class BenchPlan:
    workloads: list[str]
    qps: list[float]
    policies: list[Policy]
    profiles: list[Profile]
    duration_s: float = 300.0
    warmup_s: float = 60.0
    seed: int = 0
    workload_params: Mapping[str, str] = field(default_factory=dict)
    settings: ClusterSettings = field(default_factory=ClusterSettings)
    # A trace's requests (``--trace``): the one workload, at its own rate, instead of a generated one.
    replay: Replay | None = None

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or not 0 <= self.warmup_s < self.duration_s:
            raise ValueError(
                f"need duration > 0 and 0 <= warmup < duration (got duration {self.duration_s}, "
                f"warmup {self.warmup_s})"
            )
        if not self.qps or any(not q > 0 for q in self.qps):
            raise ValueError(f"every QPS must be > 0 (got {self.qps})")

    @property
    def runs(self) -> list[tuple[str, float, Policy]]:
        return [(w, q, p) for w in self.workloads for q in self.qps for p in self.policies]

    @property
    def max_model_len(self) -> int:
        return min(p.max_model_len for p in self.profiles)


@dataclass(slots=True)
class RunOutput:
    summary: dict[str, Any]
    ttft_ms: np.ndarray  # admitted measured requests' TTFT (inf when unfinished), for CDF plots


ProgressHook = Callable[[str, float, float], None]  # (run label, virtual seconds done, virtual seconds total)


def run_plan(plan: BenchPlan, progress: ProgressHook | None = None) -> list[RunOutput]:
    outputs: list[RunOutput] = []
    pool = describe_pool(plan.profiles)
    for workload in plan.workloads:
        for qps in plan.qps:
            requests = (
                plan.replay.requests
                if plan.replay is not None
                else generate(
                    workload,
                    qps=qps,
                    duration_s=plan.duration_s,
                    seed=plan.seed,
                    params=plan.workload_params,
                    max_model_len=plan.max_model_len,
                )
            )
            for policy in plan.policies:
                label = f"{workload} @ {qps:g} QPS · {policy.name}"
                hook = None
                if progress is not None:
                    total = plan.duration_s + plan.settings.drain_s

                    def hook(now: float, label: str = label, total: float = total) -> None:
                        progress(label, now, total)

                with ClusterSimulator.of_policy(
                    plan.profiles, policy, settings=plan.settings, seed=plan.seed
                ) as sim:
                    rec = sim.run(requests, progress=hook)
                labels = {
                    "workload": workload,
                    "policy": policy.name,
                    "qps": qps,
                    "pool": pool,
                    "seed": plan.seed,
                    "duration_s": plan.duration_s,
                    "warmup_s": plan.warmup_s,
                    "clipped_requests": getattr(requests, "clipped", 0),
                    "dropped_requests": getattr(requests, "dropped", 0),
                }
                if plan.settings.pickers > 1:  # one picker: the labels as before pickers existed
                    labels["pickers"] = plan.settings.pickers
                    labels["picker_assignment"] = plan.settings.picker_assignment
                    labels["shared_inflight"] = plan.settings.shared_inflight
                    labels["shared_predictor"] = plan.settings.shared_predictor
                summary = summarize_run(
                    rec, warmup_s=plan.warmup_s, duration_s=plan.duration_s, labels=labels
                )
                summary.update(
                    class_figures(rec, requests, warmup_s=plan.warmup_s, duration_s=plan.duration_s)
                )
                if plan.settings.pickers > 1:
                    summary["picker_shares"] = _picker_shares(rec, plan)
                outputs.append(RunOutput(summary, _measured_ttft_ms(rec, plan)))
    return outputs


def median_over_seeds(outputs: list[RunOutput]) -> list[RunOutput]:
    """One output per (workload, QPS, policy): the median of every numeric figure over the seeds' runs
    (``seeds`` lists them, ``per_seed`` keeps each run's summary), TTFTs pooled for the CDF."""
    groups: dict[tuple[str, float, str], list[RunOutput]] = {}
    for output in outputs:
        group_key = (output.summary["workload"], output.summary["qps"], output.summary["policy"])
        groups.setdefault(group_key, []).append(output)
    merged: list[RunOutput] = []
    for group in groups.values():
        if len(group) == 1:
            merged.append(group[0])
            continue
        first = group[0].summary
        summary: dict[str, Any] = {}
        for key, value in first.items():
            values = [o.summary.get(key) for o in group]
            numeric = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if key != "seed" and len(numeric) == len(values):
                summary[key] = float(np.median(numeric))
            else:
                summary[key] = value
        summary["seed"] = None
        summary["seeds"] = [o.summary["seed"] for o in group]
        summary["per_seed"] = [o.summary for o in group]
        merged.append(RunOutput(summary, np.concatenate([o.ttft_ms for o in group])))
    return merged


def _picker_shares(rec: RunRecords, plan: BenchPlan) -> list[float]:
    """Each picker's share of the measured requests."""
    measured = (rec.arrival >= plan.warmup_s) & (rec.arrival < plan.duration_s)
    counts = np.bincount(rec.picker[measured], minlength=plan.settings.pickers).astype(np.float64)
    total = counts.sum()
    return [round(float(c / total), 4) if total else 0.0 for c in counts]


def _measured_ttft_ms(rec: RunRecords, plan: BenchPlan) -> np.ndarray:
    measured = (rec.arrival >= plan.warmup_s) & (rec.arrival < plan.duration_s) & (rec.pod >= 0)
    ttft = rec.ttft_s[measured] * 1000.0
    return np.where(np.isnan(ttft), np.inf, ttft)
