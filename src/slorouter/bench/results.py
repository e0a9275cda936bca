"""The figures of one benchmark run (one workload, policy and load), from its per-request records.

Only requests that arrived in the measured window ``[warmup_s, duration_s)`` count. Latency percentiles
are over the requests the router admitted (shed ones have no latency); a request still unfinished when
the simulation stopped counts as infinitely slow, so an overloaded policy cannot look good by leaving its
worst requests out. TPOT is (E2E − TTFT) / (output tokens − 1) per request, as clients measure it.

SLO attainment: among measured requests carrying an SLO, the share that finished within every target they
carry (TTFT and/or TPOT); ``slo_attainment`` counts shed requests as misses, ``slo_attainment_admitted``
leaves them out (the admitter's promise is about the requests it lets in). Goodput: requests per second
that met their SLO (or, without SLOs, that finished). Prediction quality is over the admitted requests
routed with predictions: MAPE of the point prediction and coverage (actual ≤ predicted) of the served p90;
``e2e_mape`` compares the E2E a streaming client sees with point TTFT + point TPOT × (output tokens − 1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from slorouter.bench.records import OK, PICK_REASONS, REJECTED, SHED, RunRecords

_HUGE = 1e300  # stands in for ∞ so that interpolating next to an unfinished request gives "∞", not NaN


def _percentile(values: np.ndarray, q: float) -> float:
    if len(values) == 0:
        return math.nan
    value = float(np.percentile(np.minimum(values, _HUGE), q))
    return math.inf if value >= _HUGE * 1e-10 else value


def _ms(values: np.ndarray, q: float) -> float | None:
    value = _percentile(values, q) * 1000.0
    return None if math.isnan(value) else (math.inf if math.isinf(value) else round(value, 3))


def _finite_or_none(value: float, digits: int = 4) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def regret_summary(rec: RunRecords, picked: np.ndarray, window: float) -> dict[str, Any]:
    """Routing regret over the ``picked`` requests: the share of the reachable prefix reuse achieved and the
    avoidable prefill tokens per second, in the router's view (``reuse_achieved``; None when it indexes no
    prefix) and in the pool's (``pool_``: the engines' caches at the pick), and the mean TTFT regret (ms;
    None without TTFT estimates). Empty for records without these columns."""
    out: dict[str, Any] = {}
    views = (
        ("", rec.achieved_prefix_tokens, rec.reachable_prefix_tokens),
        ("pool_", rec.true_achieved_prefix_tokens, rec.true_reachable_prefix_tokens),
    )
    for prefix, achieved, reachable in views:
        if len(reachable) != len(picked):
            continue
        chosen = picked & (reachable >= 0)
        got, most = int(achieved[chosen].sum()), int(reachable[chosen].sum())
        out[f"{prefix}reuse_achieved"] = round(got / most, 4) if most else None
        out[f"{prefix}avoidable_prefill_tok_s"] = round((most - got) / window, 1)
    if len(rec.ttft_regret_ms) == len(picked):
        out["ttft_regret_ms_mean"] = _nan_mean(rec.ttft_regret_ms[picked])
    if len(rec.pick_reason) == len(picked):
        by_reason = {}
        for code, reason in enumerate(PICK_REASONS):
            these = picked & (rec.pick_reason == code)
            if these.any():
                avoidable = rec.reachable_prefix_tokens[these] - rec.achieved_prefix_tokens[these]
                by_reason[reason.value] = {
                    "picks": int(these.sum()),
                    "avoidable_prefill_tok_s": round(int(avoidable.sum()) / window, 1),
                    "ttft_regret_ms_mean": _nan_mean(rec.ttft_regret_ms[these]),
                }
        out["regret_by_reason"] = by_reason
    return out


def _nan_mean(values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return round(float(values.mean()), 2) if len(values) else None


def summarize_run(
    rec: RunRecords, *, warmup_s: float, duration_s: float, labels: dict[str, Any] | None = None
) -> dict[str, Any]:
    measured = (rec.arrival >= warmup_s) & (rec.arrival < duration_s)
    window = max(duration_s - warmup_s, 1e-9)
    status = rec.status
    shed = measured & (status == SHED)
    rejected = measured & (status == REJECTED)
    admitted = measured & ~shed & ~rejected & (rec.pod >= 0)
    finished = admitted & (status == OK)
    unfinished = admitted & (status != OK)

    ttft = np.where(np.isnan(rec.ttft_s), math.inf, rec.ttft_s)[admitted]
    e2e = np.where(finished, rec.e2e_s, math.inf)[admitted]
    tpot_all = rec.tpot_ms
    tpot = tpot_all[finished & ~np.isnan(tpot_all)]

    has_slo = measured & (~np.isnan(rec.slo_ttft_ms) | ~np.isnan(rec.slo_tpot_ms))
    with np.errstate(invalid="ignore"):
        ttft_ok = np.isnan(rec.slo_ttft_ms) | (rec.ttft_s * 1000.0 <= rec.slo_ttft_ms)
        tpot_ok = np.isnan(rec.slo_tpot_ms) | np.isnan(tpot_all) | (tpot_all <= rec.slo_tpot_ms)
    met = finished & ttft_ok & tpot_ok
    slo_requests = int(has_slo.sum())
    slo_admitted = int((has_slo & admitted).sum())

    out_tokens = int(rec.output_tokens[finished].sum())
    prompt_tokens = int(rec.prompt_tokens[finished].sum())
    cached_tokens = int(rec.cached_tokens[finished].sum())

    summary: dict[str, Any] = dict(labels or {})
    summary.update(
        requests=int(measured.sum()),
        admitted=int(admitted.sum()),
        finished=int(finished.sum()),
        unfinished=int(unfinished.sum()),
        shed=int(shed.sum()),
        rejected=int(rejected.sum()),
        ttft_p50_ms=_ms(ttft, 50),
        ttft_p90_ms=_ms(ttft, 90),
        ttft_p99_ms=_ms(ttft, 99),
        tpot_p50_ms=_finite_or_none(_percentile(tpot, 50), 3),
        tpot_p90_ms=_finite_or_none(_percentile(tpot, 90), 3),
        tpot_p99_ms=_finite_or_none(_percentile(tpot, 99), 3),
        e2e_p50_ms=_ms(e2e, 50),
        e2e_p95_ms=_ms(e2e, 95),
        output_tok_s=round(out_tokens / window, 1),
        slo_requests=slo_requests,
        slo_attainment=_finite_or_none(
            float((met & has_slo).sum()) / slo_requests if slo_requests else math.nan
        ),
        slo_attainment_admitted=_finite_or_none(
            float((met & has_slo).sum()) / slo_admitted if slo_admitted else math.nan
        ),
        goodput_rps=round(float((met & has_slo).sum() if slo_requests else finished.sum()) / window, 3),
        prefix_cache_hit_rate=_finite_or_none(cached_tokens / prompt_tokens if prompt_tokens else math.nan),
    )
    summary.update(regret_summary(rec, admitted, window))
    # How the router spread the load: each pod's share of the admitted requests, and the busiest one's.
    served_by = np.bincount(rec.pod[admitted], minlength=len(rec.pod_profiles)).astype(np.float64)
    shares = served_by / served_by.sum() if served_by.sum() else served_by
    summary["pod_shares"] = [round(float(x), 4) for x in shares]
    summary["busiest_pod_share"] = round(float(shares.max()), 4) if len(shares) else None
    routed = finished & rec.predicted
    summary["predicted_share"] = _finite_or_none(
        float(rec.predicted[admitted].mean()) if admitted.any() else math.nan
    )
    for kind, actual_ms in (("ttft", rec.ttft_s * 1000.0), ("tpot", tpot_all)):
        served = rec.predicted_ttft_ms if kind == "ttft" else rec.predicted_tpot_ms
        point = rec.point_ttft_ms if kind == "ttft" else rec.point_tpot_ms
        ok = routed & ~np.isnan(served) & ~np.isnan(actual_ms) & (actual_ms > 0)
        if ok.any():
            actual = actual_ms[ok]
            summary[f"{kind}_mape"] = round(float(np.mean(np.abs(actual - point[ok]) / actual)), 4)
            summary[f"{kind}_p90_coverage"] = round(float(np.mean(actual <= served[ok])), 4)
        else:
            summary[f"{kind}_mape"] = summary[f"{kind}_p90_coverage"] = None
    # E2E as a streaming client sees it: predicted TTFT + predicted TPOT × (output tokens − 1).
    point_e2e = rec.point_ttft_ms + rec.point_tpot_ms * np.maximum(rec.output_tokens - 1, 0)
    actual_e2e = rec.e2e_s * 1000.0
    ok = routed & ~np.isnan(point_e2e) & (actual_e2e > 0)
    summary["e2e_mape"] = (
        round(float(np.mean(np.abs(actual_e2e[ok] - point_e2e[ok]) / actual_e2e[ok])), 4)
        if ok.any()
        else None
    )
    summary.update(
        sim_virtual_s=round(rec.virtual_s, 3),
        sim_wall_s=round(rec.wall_s, 3),
        sim_steps=rec.steps,
        sim_events=rec.events,
        trainings=rec.trainings,
        preemptions=int(rec.facts.get("preemptions", 0)),
    )
    actions = rec.facts.get("slo_actions")
    if actions is not None:  # +slo policies: deadlines and hedges over the whole run
        hedges = actions["hedges"]
        prefill = int((rec.prompt_tokens - rec.cached_tokens)[rec.status == OK].sum())
        summary.update(
            hedges_sent=hedges.get("sent", 0),
            hedges_won=hedges.get("won", 0),
            hedges_skipped=sum(actions["hedges_skipped"].values()),
            deadline_cancellations=sum(actions["cancelled"].values()),
            # Prompt tokens the engines computed for copies that lost (aborted then), over the prefill of the
            # finished requests: the extra prefill hedging cost.
            hedge_extra_prefill=round(actions["thrown_prefill_tokens"] / prefill, 4) if prefill else None,
        )
    tuning = rec.facts.get("tuning")
    if tuning is not None:  # the self-tuning policy: each round, and the candidate active at the end
        summary["tuning_rounds"] = tuning
        summary["tuning_switches"] = sum(1 for r in tuning if r["switch_to"] is not None)
        summary["post_switch_worst_ratio"] = post_switch_worst_ratio(
            rec, [float(r["at"]) for r in tuning if r["switch_to"] is not None]
        )
    return summary


POST_SWITCH_PERIOD_S = 10.0
POST_SWITCH_WATCH_S = 60.0


def post_switch_worst_ratio(rec: RunRecords, switches: list[float]) -> float | None:
    """The largest TTFT p90 of a 10-second window of arrivals in the minute after a switch, over the TTFT p90
    of the 10 seconds before it (an unfinished request counts as infinitely slow); None without a switch
    whose windows hold requests."""
    ttft = np.where(np.isnan(rec.ttft_s), np.inf, rec.ttft_s)
    sent = rec.pod >= 0
    worst: float | None = None
    for at in switches:
        before = ttft[sent & (rec.arrival >= at - POST_SWITCH_PERIOD_S) & (rec.arrival < at)]
        if not len(before):
            continue
        base = float(np.quantile(before, 0.9, method="inverted_cdf"))
        start = at
        while start < at + POST_SWITCH_WATCH_S:
            window = ttft[sent & (rec.arrival >= start) & (rec.arrival < start + POST_SWITCH_PERIOD_S)]
            if len(window):
                ratio = float(np.quantile(window, 0.9, method="inverted_cdf")) / base
                worst = ratio if worst is None else max(worst, ratio)
            start += POST_SWITCH_PERIOD_S
    return None if worst is None else round(worst, 4)
