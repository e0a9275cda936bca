"""Builders for scheduling tests: pools with set signals, requests, plugin contexts, a Director on a manual
clock to drive requests through the whole lifecycle, random candidates (ties, many sizes) for comparing two
code paths bit for bit, and the approximate prefix cache's producer with a scheduling result to hand to its
hooks."""

from __future__ import annotations

from typing import Any

import numpy as np

from slorouter.clock import ManualClock
from slorouter.director import Director
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling.datakeys import INFLIGHT_TOKENS, PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import Admitter, PluginContext
from slorouter.scheduling.plugins.prefix.approx import ApproxPrefixCacheParams, ApproxPrefixCacheProducer
from slorouter.scheduling.types import Candidates, InferenceRequest, ProfileRunResult, SchedulingResult


def addresses(n: int) -> list[str]:
    return [f"10.0.0.{i + 1}:8000" for i in range(n)]


def make_pool(n: int, **metrics: list[Any]) -> PoolState:
    """A pool of ``n`` endpoints; keyword lists give one MetricsSnapshot field per endpoint."""
    pool = PoolState([Endpoint(a) for a in addresses(n)])
    for i, address in enumerate(addresses(n)):
        snapshot = MetricsSnapshot(**{field: values[i] for field, values in metrics.items()})
        pool.set_metrics(address, snapshot, at=0.0)
    return pool


def candidates_of(pool: PoolState) -> Candidates:
    return Candidates.healthy(pool)


def make_request(prompt: str = "", model: str = "m", **fields: Any) -> InferenceRequest:
    return InferenceRequest(
        request_id=fields.pop("request_id", "r"),
        model=model,
        prompt_text=prompt,
        prompt_tokens=fields.pop("prompt_tokens", len(prompt) // 4),
        max_tokens=fields.pop("max_tokens", 16),
        **fields,
    )


def make_ctx(seed: int = 0, pool: PoolState | None = None) -> PluginContext:
    return PluginContext(rng=np.random.default_rng(seed), pool=pool)


def make_director(pool: PoolState, config: dict[str, Any] | None = None, seed: int = 0) -> Director:
    """A Director over ``pool`` with the scheduler ``config`` builds (the built-in one for None), its plugins'
    randomness seeded, on a manual clock (``director.clock``, at 0)."""
    clock = ManualClock(0.0)
    context = PluginContext(clock=clock, rng=np.random.default_rng(seed), pool=pool)
    return Director(pool, build_scheduler_setup(config, context), InFlightTracker(pool), clock)


def serve(director: Director, request: InferenceRequest) -> SchedulingResult:
    """``request`` through ``director`` at once: scheduled (data producers, admitters, scheduler), dispatched
    (pre-request hooks), answered (200, one token) and completed (response hooks); its pick."""
    result = director.schedule(request)
    lifecycle = director.dispatch(request, result)
    lifecycle.on_headers(200, streaming=False)
    lifecycle.end()
    return result


class SeenCandidates(Admitter):
    """An admitter that keeps the candidates it was last shown: what the data producers attached to them."""

    candidates: Candidates | None = None

    def admit(self, request: InferenceRequest, candidates: Candidates) -> None:
        self.candidates = candidates


def produced(director: Director, request: InferenceRequest) -> Candidates:
    """The candidates as the data producers left them for ``request`` (scheduled, not dispatched)."""
    seen = SeenCandidates()
    director.setup.admitters.append(seen)
    try:
        director.schedule(request)
    finally:
        director.setup.admitters.remove(seen)
    assert seen.candidates is not None
    return seen.candidates


def bits(values) -> list[str]:
    """The values as exact hex strings (NaN, -0.0 and infinities compare as written)."""
    return [float(v).hex() for v in values]


def random_pool(rng: np.random.Generator, n: int) -> PoolState:
    pool = PoolState([Endpoint(f"10.1.0.{i + 1}:8000") for i in range(n)])
    small = int(rng.integers(1, 6))  # few distinct values: ties are common
    for endpoint in pool.endpoints:
        kv = float(rng.choice([0.0, 1.0, rng.random(), round(rng.random(), 1)]))
        snapshot = MetricsSnapshot(
            waiting=int(rng.integers(0, small)), running=int(rng.integers(0, 300)), kv_usage=kv
        )
        pool.set_metrics(endpoint.address, snapshot, at=0.0)
        pool.add_inflight(endpoint.address, 1, int(rng.integers(0, 5_000_000)), int(rng.integers(0, 10)))
    return pool


def random_candidates(rng: np.random.Generator, n: int) -> Candidates:
    candidates = Candidates.healthy(random_pool(rng, n))
    total = int(rng.integers(0, 20))
    candidates.attrs[PREFIX_TOTAL_BLOCKS] = np.full(n, total, dtype=np.int64)
    candidates.attrs[PREFIX_MATCH_BLOCKS] = rng.integers(0, total + 1, size=n).astype(np.int64)
    tokens = candidates.column("inflight_prefill_tokens") + candidates.column("inflight_decode_tokens")
    candidates.attrs[INFLIGHT_TOKENS] = tokens
    return candidates


def producer(seed=0, pool=None, **params):
    return ApproxPrefixCacheProducer(
        "approx-prefix-cache-producer", ApproxPrefixCacheParams(**params), make_ctx(seed, pool)
    )


def result_for(*targets: Endpoint, prefill: Endpoint | None = None) -> SchedulingResult:
    results = {"decode": ProfileRunResult(list(targets))}
    if prefill is not None:
        results["prefill"] = ProfileRunResult([prefill])
    return SchedulingResult(results, "decode")
