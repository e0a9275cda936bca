"""Figures per priority class and per tenant, for workloads that have them (the overload scenarios).

Over the measured requests of each class, a request that got no first token (dropped by a limit or its
TTL, shed, or unfinished) counts as infinitely slow: a policy cannot improve a class's percentile by
turning its requests away. Sheddable requests are left out of the non-sheddable figures (they may be
dropped by design), and ``sheddable_dropped`` counts those that were.

Where flow control held requests, ``*_queued_*`` is the time in its queue and ``*_pod_ttft_*`` the rest of
the TTFT (pick, pod queue, prefill), over the requests that got a first token: the split says whether a
class waited in the router or in the engines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from slorouter.bench.records import RunRecords
from slorouter.bench.workloads.request import BenchRequest

Figures = dict[str, float | int | None]


def _ms(ttft_s: np.ndarray, q: float) -> float | None:
    if not len(ttft_s):
        return None
    value = float(np.percentile(np.where(np.isnan(ttft_s), np.inf, ttft_s), q, method="higher"))
    return math.inf if math.isinf(value) else round(value * 1000.0, 3)


def _split(rec: RunRecords, mask: np.ndarray, prefix: str, q: float) -> Figures:
    """Queue time and pod-side TTFT at percentile ``q`` over ``mask``'s served requests."""
    served = mask & ~np.isnan(rec.ttft_s)
    if len(rec.queued_s) != len(rec.ttft_s) or not served.any():
        return {}
    queued = np.nan_to_num(rec.queued_s[served])
    return {
        f"{prefix}_queued_p{q:g}_ms": _ms(queued, q),
        f"{prefix}_pod_ttft_p{q:g}_ms": _ms(rec.ttft_s[served] - queued, q),
    }


def class_figures(
    rec: RunRecords, requests: Sequence[BenchRequest], *, warmup_s: float, duration_s: float
) -> Figures:
    """TTFT percentiles by priority class and tenant (an empty dict when the workload has neither)."""
    priority = np.fromiter((r.priority for r in requests), dtype=np.int64, count=len(requests))
    tenants = [r.tenant for r in requests]
    measured = (rec.arrival >= warmup_s) & (rec.arrival < duration_s)
    ttft = rec.ttft_s
    served = ~np.isnan(ttft)
    figures: Figures = {}
    if (priority != 0).any():
        standing = measured & (priority >= 0)
        critical = measured & (priority > 0)
        sheddable = measured & (priority < 0)
        figures.update(
            nonsheddable_ttft_p90_ms=_ms(ttft[standing], 90),
            nonsheddable_ttft_p99_ms=_ms(ttft[standing], 99),
            nonsheddable_dropped=int((standing & ~served).sum()),
            critical_ttft_p90_ms=_ms(ttft[critical], 90),
            critical_ttft_p99_ms=_ms(ttft[critical], 99),
            sheddable_ttft_p90_ms=_ms(ttft[sheddable & served], 90),
            sheddable_dropped=int((sheddable & ~served).sum()),
        )
        figures.update(_split(rec, critical, "critical", 99))
    names = sorted({t for t in tenants if t})
    if names:
        tenant = np.array(tenants, dtype=object)
        for name in names:
            mine = measured & (tenant == name)
            figures[f"tenant_{name}_requests"] = int(mine.sum())
            figures[f"tenant_{name}_ttft_p90_ms"] = _ms(ttft[mine], 90)
            figures[f"tenant_{name}_ttft_p99_ms"] = _ms(ttft[mine], 99)
            figures.update(_split(rec, mine, f"tenant_{name}", 90))
    return figures
