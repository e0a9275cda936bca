"""Replaying the router's window in the twin under one pipeline."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.tuning.figures import Figures, figures
from slorouter.bench.tuning.twin import PoolTwin
from slorouter.bench.workloads.request import BenchRequest, WorkloadRequests
from slorouter.bench.workloads.trace import BlockTexts
from slorouter.predictor.model_store import ModelMetadata
from slorouter.serving.traffic_window import BLOCK_TOKENS, WindowEntry

DEFAULT_OUTPUT_TOKENS = 16  # a request that failed before any token: replayed with this many
MAX_MODEL_LEN = 131_072
COPY_OFFSET_S = 0.001


@dataclass(frozen=True, slots=True)
class Traffic:
    """The window as the twin's workload: requests from 0 s, and the entries they came from (same order)."""

    requests: WorkloadRequests
    entries: tuple[WindowEntry, ...]
    start: float  # the router-clock time of 0 s

    @classmethod
    def of(cls, entries: Sequence[WindowEntry], copies: int = 1) -> Traffic:
        """``copies`` > 1: the window of one of that many pickers sharing the pool, which see alike traffic:
        every entry that many times (copy k a k-millisecond later, with the same prefix blocks), so that the
        twin's pods carry the whole pool's load."""
        if copies < 1:
            raise ValueError(f"copies must be >= 1 (got {copies})")
        if copies > 1:
            entries = [
                dataclasses.replace(e, arrival=e.arrival + k * COPY_OFFSET_S) if k else e
                for e in entries
                for k in range(copies)
            ]
        ordered = sorted(entries, key=lambda e: e.arrival)
        start = ordered[0].arrival if ordered else 0.0
        texts = BlockTexts(BLOCK_TOKENS)
        requests = []
        for index, e in enumerate(ordered):
            output = e.output_tokens or e.max_tokens or DEFAULT_OUTPUT_TOKENS
            requests.append(
                BenchRequest(
                    arrival=e.arrival - start,
                    prompt=texts.prompt(tuple(e.block_hashes), max(e.prompt_tokens, 1), index),
                    max_tokens=max(output, 1),
                    slo_ttft_ms=e.slo_ttft_ms,
                    slo_tpot_ms=e.slo_tpot_ms,
                    priority=e.priority,
                )
            )
        return cls(WorkloadRequests("window", requests), tuple(ordered), start)

    @property
    def max_model_len(self) -> int:
        longest = max((r.max_tokens + len(r.prompt) for r in self.requests), default=0)
        return max(MAX_MODEL_LEN, longest)


def replay(
    twin: PoolTwin,
    config: Mapping[str, Any],
    traffic: Traffic,
    *,
    measure_from_s: float,
    models: Sequence[tuple[bytes, ModelMetadata]] = (),
    uses_predictor: bool = False,
    seed: int = 0,
    settings: ClusterSettings | None = None,
    switches: Sequence[tuple[float, str]] = (),
) -> Figures:
    """The figures of the requests arriving from ``measure_from_s`` (seconds into the traffic) when the
    twin serves ``traffic`` routed by ``config`` (switching candidates at ``switches``: seconds into the
    traffic, candidate). A pipeline with a predictor serves ``models`` (the live router's) and does not
    train."""
    base = settings or ClusterSettings()
    settings = ClusterSettings(
        scrape_interval_s=base.scrape_interval_s,
        network_s=base.network_s,
        drain_s=base.drain_s,
        training=False,
    )
    with ClusterSimulator(
        twin.profiles(traffic.max_model_len),
        dict(config),
        use_predictor=uses_predictor,
        settings=settings,
        seed=seed,
    ) as sim:
        if uses_predictor and models:
            sim.load_models(models)
        rec = sim.run(traffic.requests, switches=switches)
    measured = rec.arrival >= measure_from_s
    nan = math.nan
    ttft = rec.ttft_s[measured] * 1000.0
    e2e = rec.e2e_s[measured] * 1000.0
    outputs = rec.output_tokens[measured]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs > 1, (e2e - ttft) / (outputs - 1), nan)
    return figures(
        ttft,
        tpot,
        e2e,
        rec.pod[measured].astype(np.int64),
        rec.slo_ttft_ms[measured],
        rec.slo_tpot_ms[measured],
    )
