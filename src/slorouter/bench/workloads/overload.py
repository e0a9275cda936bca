"""Overload scenarios: a base workload with a burst, two tenants of unequal rates, and mixed priorities.

- **Burst.** ``qps`` is the base rate; from ``burst_start_s`` for ``burst_s`` seconds the rate is
  ``burst_qps``. The base workload is generated over a longer span and its time axis is compressed inside the
  burst window by ``burst_qps / qps``, so a Poisson base stays Poisson at the burst rate, conversations keep
  their structure (their turns come closer together during the burst), and the requests outside the window
  are the base workload's own.
- **Tenants.** With ``heavy_tenant_ratio`` set, every request belongs to tenant ``heavy`` or ``light`` (the
  fairness id, ``x-llm-d-inference-fairness-id``), heavy sending that many times light's rate; a session
  keeps its tenant. ``tenants=light`` (or ``heavy``) keeps only that tenant's requests, exactly the ones it
  sends beside the other, to measure it alone.
- **Priorities.** ``critical_share`` of the requests get priority 1 (critical), ``sheddable_share``
  priority −1 (sheddable), the rest 0 (standard), drawn independently of everything else.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import Field, model_validator

from slorouter.bench.workloads.draft import Draft, stream
from slorouter.bench.workloads.maas import MaasParams, Ratio
from slorouter.bench.workloads.params import OptionalPositive, Share, WorkloadParams
from slorouter.bench.workloads.request import BenchRequest, WorkloadRequests
from slorouter.bench.workloads.sharegpt import ShareGPTParams

CRITICAL, STANDARD, SHEDDABLE = 1, 0, -1
HEAVY, LIGHT = "heavy", "light"


class OverloadParams(WorkloadParams):
    burst_qps: OptionalPositive = None  # rate during the burst; none: no burst
    burst_start_s: Annotated[float, Field(ge=0)] = 60.0
    burst_s: Annotated[float, Field(gt=0)] = 60.0
    heavy_tenant_ratio: OptionalPositive = None  # heavy tenant's rate / light's; none: one tenant
    tenants: Literal["both", "light", "heavy"] = "both"
    critical_share: Share = 0.0  # share of requests with priority 1

    @model_validator(mode="after")
    def _shares(self) -> OverloadParams:
        if self.critical_share + self.sheddable_share > 1:
            raise ValueError("critical_share + sheddable_share must not exceed 1")
        if self.tenants != "both" and self.heavy_tenant_ratio is None:
            raise ValueError("tenants=light or heavy needs heavy_tenant_ratio")
        return self


BaseBuilder = Callable[..., list[Draft]]


def bursting(base: BaseBuilder) -> Callable[[OverloadParams, float, float, int], list[Draft]]:
    """``base``'s drafts with the burst of ``params`` (unchanged without ``burst_qps``)."""

    def build(params: OverloadParams, qps: float, duration_s: float, seed: int) -> list[Draft]:
        if params.burst_qps is None:
            return base(params, qps, duration_s, seed)
        factor = params.burst_qps / qps
        start = min(params.burst_start_s, duration_s)
        burst = min(params.burst_s, duration_s - start)
        # Base time runs factor × faster inside the window: it spans factor × burst seconds of base time.
        span = duration_s + (factor - 1.0) * burst
        drafts = base(params, qps, span, seed)
        warped = []
        for draft in drafts:
            t = draft.arrival
            if t >= start + factor * burst:
                t -= (factor - 1.0) * burst
            elif t >= start:
                t = start + (t - start) / factor
            if t < duration_s:
                warped.append(dataclasses.replace(draft, arrival=t))
        return warped

    return build


def apply_classes(params: OverloadParams, requests: WorkloadRequests, seed: int) -> WorkloadRequests:
    """Tenants and priorities on the assembled requests; only one tenant's with ``tenants`` set."""
    n = len(requests)
    draws = stream(seed, "priority-mix").random(n).tolist()
    tenant_draws = stream(seed, "tenants").random(n).tolist()
    light_share = None if params.heavy_tenant_ratio is None else 1.0 / (1.0 + params.heavy_tenant_ratio)
    kept: list[BenchRequest] = []
    for request, u, v in zip(requests, draws, tenant_draws, strict=True):
        if u < params.critical_share:
            priority = CRITICAL
        elif u >= 1.0 - params.sheddable_share:
            priority = SHEDDABLE
        else:
            priority = STANDARD
        tenant = ""
        if light_share is not None:
            if request.session >= 0:  # a session keeps its tenant: a draw of its own, from its id
                v = (zlib.crc32(f"{seed}/{request.session}".encode()) & 0xFFFFFF) / float(1 << 24)
            tenant = LIGHT if v < light_share else HEAVY
            if params.tenants != "both" and tenant != params.tenants:
                continue
        kept.append(dataclasses.replace(request, priority=priority, tenant=tenant))
    return WorkloadRequests(requests.name, kept, clipped=requests.clipped, dropped=requests.dropped)


class ShareGPTBurstParams(ShareGPTParams, OverloadParams):
    """sharegpt at ``qps`` with a burst to ``burst_qps`` (2× the 150 QPS the sharegpt knee is at on 8
    ``qwen3-32b-h100-tp2`` pods), critical / standard / sheddable at 20 / 50 / 30 %."""

    burst_qps: OptionalPositive = 300.0
    critical_share: Share = 0.2
    sheddable_share: Share = 0.3
    slo_ttft_ms: OptionalPositive = 1000.0


class MaasBurstParams(MaasParams, OverloadParams):
    """maas-mix at a steady ``qps`` (no alternation) with a burst to ``burst_qps`` (2× the 225 QPS of its
    knee on 8 ``qwen3-32b-h100-tp2`` pods), critical / standard / sheddable at 20 / 50 / 30 %."""

    rate_ratio: Ratio = 1.0
    burst_qps: OptionalPositive = 450.0
    critical_share: Share = 0.2
    sheddable_share: Share = 0.3
    slo_ttft_ms: OptionalPositive = 1000.0


class TwoTenantsParams(ShareGPTParams, OverloadParams):
    """sharegpt from two tenants, one sending 10× the other's rate."""

    heavy_tenant_ratio: OptionalPositive = 10.0
    slo_ttft_ms: OptionalPositive = 1000.0


class MixedPriorityParams(ShareGPTParams, OverloadParams):
    """sharegpt with critical / standard / sheddable requests at 20 / 50 / 30 %."""

    critical_share: Share = 0.2
    sheddable_share: Share = 0.3
    slo_ttft_ms: OptionalPositive = 1000.0
