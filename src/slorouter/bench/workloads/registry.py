"""The workloads by name: their parameter models, generators and the public entry points."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slorouter.bench.workloads import (
    code_generation,
    maas,
    new_user,
    overload,
    realtime_mix,
    reasoning,
    shared_prefix,
    sharegpt,
)
from slorouter.bench.workloads.draft import Draft, assemble
from slorouter.bench.workloads.params import WorkloadParams, defaults, parse_params
from slorouter.bench.workloads.request import WorkloadRequests

Builder = Callable[[Any, float, float, int], list[Draft]]
# After clipping: what a scenario adds to the requests (tenants, priorities), from its parameters and seed.
Finish = Callable[[Any, WorkloadRequests, int], WorkloadRequests]


@dataclass(frozen=True, slots=True)
class Workload:
    params: type[WorkloadParams]
    build: Builder
    description: str
    finish: Finish | None = None


_WORKLOADS: dict[str, Workload] = {
    "sharegpt": Workload(
        sharegpt.ShareGPTParams, sharegpt.build, "ShareGPT V3 conversations, real lengths, shared history"
    ),
    **{
        name: Workload(model, shared_prefix.build, f"llm-d predicted-latency scenario {name[-1].upper()}")
        for name, model in shared_prefix.SCENARIOS.items()
        if name not in ("b2b-saas", "high-churn")
    },
    "b2b-saas": Workload(
        shared_prefix.SCENARIOS["b2b-saas"],
        shared_prefix.build,
        "150 system prompts of 6,000 tokens × 5 users, 1,200-token questions, 1,000-token answers",
    ),
    "high-churn": Workload(
        shared_prefix.SCENARIOS["high-churn"],
        shared_prefix.build,
        "160 documents of 20,000 tokens × 5 users, 300-token questions: more prefixes than the KV holds",
    ),
    "maas-mix": Workload(
        maas.MaasParams, maas.build, "production-like heavy-tailed sessions, alternating low/high rate"
    ),
    "code-generation": Workload(
        code_generation.CodeGenerationParams,
        code_generation.build,
        "prefill-bound: long shared repository contexts, short outputs",
    ),
    "reasoning": Workload(
        reasoning.ReasoningParams, reasoning.build, "decode-bound: short prompts, long outputs"
    ),
    "new-user": Workload(
        new_user.NewUserParams,
        new_user.build,
        "multi-turn chat under shared system prompts beside new users' 4k-16k-token single prompts",
    ),
    "realtime-mix": Workload(
        realtime_mix.RealtimeMixParams,
        realtime_mix.build,
        "the real-time benchmark's workload: short chat beside 3k-8k-token questions on shared documents",
    ),
    "sharegpt-burst": Workload(
        overload.ShareGPTBurstParams,
        overload.bursting(sharegpt.build),
        "sharegpt with a one-minute burst to burst_qps; critical/standard/sheddable 20/50/30 %",
        overload.apply_classes,
    ),
    "maas-burst": Workload(
        overload.MaasBurstParams,
        overload.bursting(maas.build),
        "steady maas-mix with a one-minute burst to burst_qps; critical/standard/sheddable 20/50/30 %",
        overload.apply_classes,
    ),
    "two-tenants": Workload(
        overload.TwoTenantsParams,
        overload.bursting(sharegpt.build),
        "sharegpt from a heavy and a light tenant, heavy at 10x light's rate",
        overload.apply_classes,
    ),
    "mixed-priority": Workload(
        overload.MixedPriorityParams,
        overload.bursting(sharegpt.build),
        "sharegpt with critical/standard/sheddable requests at 20/50/30 %",
        overload.apply_classes,
    ),
}


def _workload(name: str) -> Workload:
    try:
        return _WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r} (known: {', '.join(_WORKLOADS)})") from None


def workload_names() -> list[str]:
    """Every workload name, in documentation order."""
    return list(_WORKLOADS)


def workload_description(name: str) -> str:
    """One line on what the workload is."""
    return _workload(name).description


def workload_defaults(name: str) -> dict[str, Any]:
    """Every parameter of the workload with its default."""
    return defaults(_workload(name).params)


def generate(
    name: str,
    *,
    qps: float,
    duration_s: float,
    seed: int,
    params: Mapping[str, str | int | float] | None = None,
    max_model_len: int | None = None,
) -> WorkloadRequests:
    """The requests of workload ``name`` at mean rate ``qps`` over ``duration_s`` seconds.

    Deterministic for a given (name, qps, duration_s, seed, params, max_model_len). ``params`` override
    the defaults by name (strings are parsed, as from ``--workload-param key=value``). Requests that do not
    fit ``max_model_len`` are clipped or dropped and counted (see ``clip``). Raises ``ValueError`` naming the
    workload and parameter on an unknown name or a bad value.
    """
    workload = _workload(name)
    parsed = parse_params(name, workload.params, params)
    if not (math.isfinite(qps) and qps > 0):
        raise ValueError(f"workload {name!r}: qps must be a positive number, got {qps!r}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"workload {name!r}: duration_s must be a positive number, got {duration_s!r}")
    if max_model_len is not None and max_model_len < 2:
        raise ValueError(f"workload {name!r}: max_model_len must be at least 2, got {max_model_len!r}")
    drafts = workload.build(parsed, qps, duration_s, seed)
    requests = assemble(name, drafts, parsed, seed, max_model_len)
    return requests if workload.finish is None else workload.finish(parsed, requests, seed)
