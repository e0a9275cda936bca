"""Latency figures of a span of traffic, observed (the router's window) or replayed (the twin's run)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slorouter.serving.traffic_window import WindowEntry

MIN_POD_REQUESTS = 8  # fewer requests on a pod: its own figures are not used (the pool's are)


@dataclass(frozen=True, slots=True)
class PodFigures:
    requests: int
    ttft_p50_ms: float
    tpot_p50_ms: float  # NaN: no streamed reply of two tokens or more


@dataclass(frozen=True, slots=True)
class Figures:
    """TTFT and TPOT percentiles (ms) of the requests of a span; a request that did not finish counts as
    infinitely slow in TTFT, as in the benchmark."""

    requests: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    e2e_p50_ms: float
    slo_attainment: float | None  # over requests with an SLO; None: none had one
    pods: dict[int, PodFigures]  # by pod index

    def errors_against(self, truth: Figures) -> dict[str, float]:
        """Relative error of each headline figure against ``truth`` (|self / truth − 1|)."""
        out = {}
        for name in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms"):
            mine, theirs = getattr(self, name), getattr(truth, name)
            if math.isfinite(mine) and math.isfinite(theirs) and theirs > 0:
                out[name] = abs(mine / theirs - 1.0)
            elif not (math.isnan(mine) and math.isnan(theirs)):
                out[name] = math.inf
        return out


def figures(
    ttft_ms: np.ndarray,
    tpot_ms: np.ndarray,
    e2e_ms: np.ndarray,
    pod: np.ndarray,
    slo_ttft_ms: np.ndarray,
    slo_tpot_ms: np.ndarray,
) -> Figures:
    """Figures of requests given column-wise (NaN TTFT: unfinished; NaN TPOT: none; pod −1: not sent)."""
    n = len(ttft_ms)
    ttft = np.where(np.isnan(ttft_ms), np.inf, ttft_ms)
    tpot = tpot_ms[~np.isnan(tpot_ms)]
    e2e = np.where(np.isnan(e2e_ms), np.inf, e2e_ms)
    with_slo = ~np.isnan(slo_ttft_ms) | ~np.isnan(slo_tpot_ms)
    attainment = None
    if with_slo.any():
        ttft_ok = np.isnan(slo_ttft_ms) | (ttft <= slo_ttft_ms)
        tpot_ok = np.isnan(slo_tpot_ms) | np.isnan(tpot_ms) | (tpot_ms <= slo_tpot_ms)
        attainment = float(np.mean((ttft_ok & tpot_ok & np.isfinite(ttft))[with_slo]))
    pods = {}
    for index in np.unique(pod[pod >= 0]).tolist():
        mask = pod == index
        pod_tpot = tpot_ms[mask & ~np.isnan(tpot_ms)]
        pods[int(index)] = PodFigures(
            int(mask.sum()),
            _quantile(ttft[mask], 0.5),
            _quantile(pod_tpot, 0.5) if len(pod_tpot) else math.nan,
        )
    return Figures(
        requests=n,
        ttft_p50_ms=_quantile(ttft, 0.5),
        ttft_p90_ms=_quantile(ttft, 0.9),
        ttft_p99_ms=_quantile(ttft, 0.99),
        tpot_p50_ms=_quantile(tpot, 0.5) if len(tpot) else math.nan,
        tpot_p90_ms=_quantile(tpot, 0.9) if len(tpot) else math.nan,
        e2e_p50_ms=_quantile(e2e, 0.5),
        slo_attainment=attainment,
        pods=pods,
    )


def observed(entries: Sequence[WindowEntry], pod_of: dict[str, int]) -> Figures:
    """Figures of what the router saw of ``entries``."""
    nan = math.nan
    ttft = np.array([nan if e.ttft_ms is None else e.ttft_ms for e in entries], dtype=np.float64)
    tpot = np.array([nan if e.tpot_ms is None else e.tpot_ms for e in entries], dtype=np.float64)
    e2e = ttft + np.array(
        [0.0 if e.tpot_ms is None else e.tpot_ms * max(e.output_tokens - 1, 0) for e in entries],
        dtype=np.float64,
    )
    pod = np.array([pod_of.get(e.endpoint, -1) for e in entries], dtype=np.int64)
    slo_ttft = np.array([nan if e.slo_ttft_ms is None else e.slo_ttft_ms for e in entries], dtype=np.float64)
    slo_tpot = np.array([nan if e.slo_tpot_ms is None else e.slo_tpot_ms for e in entries], dtype=np.float64)
    return figures(ttft, tpot, e2e, pod, slo_ttft, slo_tpot)


def _quantile(values: np.ndarray, q: float) -> float:
    if not len(values):
        return math.nan
    return float(np.quantile(values, q, method="inverted_cdf"))
