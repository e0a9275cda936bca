"""Realistic training samples from the simulator's engine model, in virtual time (seeded, deterministic).

A few ``slorouter.sim.engine.Engine`` instances serve Poisson traffic whose rate changes every ``phase_s``
virtual seconds (from light load to overload, split unevenly over the engines), with log-normal prompt and
output lengths and prompts that often start with one of a few shared prefixes (system prompts, documents).
A stand-in router dispatches each request to a random engine and records, at that moment, the feature row
exactly as the real router would build it for the chosen endpoint:

- ``kv_cache_percentage``, ``num_request_waiting``, ``num_request_running``: the engine's gauges as last
  scraped (every ``scrape_interval_s``, as the pool scraper does; 0 reads them live);
- ``prefill_tokens_in_flight``, ``decode_tokens_in_flight``: the router's own in-flight counters before this
  request is added (the semantics of ``slorouter.pool.inflight``: prefill counts the prompt tokens the
  router's index does not expect the engine to hold), the same value a prediction would see;
- ``prefix_cache_score``: matched leading blocks / full blocks of the prompt in a router-side index of the
  blocks it sent to that engine (64-byte blocks, like the approximate prefix index);
- ``input_token_length``, ``num_tokens_generated`` (the request's output length, i.e. ``max_tokens``).

The targets are what the router observes: TTFT = first token − arrival, and
TPOT = (end-to-end − TTFT) / (output tokens − 1) (NaN for one-token outputs). The TPOT row is the same
dispatch-time snapshot, not end-of-request metrics (a train/serve skew of the original).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import xxhash

from slorouter.predictor.features import (
    ALL_FEATURES,
    DECODE_TOKENS_IN_FLIGHT,
    DEFAULT_SCHEMA,
    EFFECTIVE_INPUT_TOKENS,
    INPUT_TOKEN_LENGTH,
    KV_CACHE_PERCENTAGE,
    NUM_REQUEST_RUNNING,
    NUM_REQUEST_WAITING,
    NUM_TOKENS_GENERATED,
    POD_CLASS,
    PREFILL_TOKENS_IN_FLIGHT,
    PREFIX_CACHE_SCORE,
    FeatureSchema,
    ModelKind,
    check_kind,
    columns_to_matrix,
    pod_class_code,
)
from slorouter.sim.engine import Engine, RequestId, StepOutput
from slorouter.sim.profiles import Profile, get_profile
from slorouter.tokenizer import BYTES_PER_TOKEN

_BLOCK_BYTES = 16 * BYTES_PER_TOKEN
_ROOT = 0x51_0C_0DE
_ARRIVAL, _STEP_END, _WAKE, _SCRAPE = range(4)


@dataclass(frozen=True, slots=True)
class SimWorkload:
    """Traffic and cluster of a sample generation run."""

    num_engines: int = 4
    profiles: tuple[str, ...] = ("llama3-8b-h100",)  # assigned to engines round-robin
    slowdown: tuple[float, ...] = (1.0,)  # per-engine step-time multiplier, round-robin (mixed pools)
    load_range: tuple[float, float] = (0.05, 1.1)  # utilisation of a phase, drawn uniformly
    phase_s: float = 5.0
    prompt_median: float = 300.0  # tokens, log-normal
    prompt_sigma: float = 0.9
    prompt_max: int = 8000
    output_median: float = 100.0
    output_sigma: float = 0.9
    output_max: int = 1500
    shared_prefix_share: float = 0.6  # requests starting with one of the shared prefixes
    num_prefixes: int = 12
    prefix_range: tuple[int, int] = (100, 1500)  # tokens of a shared prefix
    scrape_interval_s: float = 0.05
    prefix_index_blocks: int = 30_000  # router-side prefix index capacity per engine (LRU)


@dataclass(slots=True)
class SimSamples:
    """Feature columns (float64, one entry per request) and the observed latencies."""

    columns: dict[str, np.ndarray]
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray  # NaN for one-token outputs
    endpoint: np.ndarray  # engine index per request
    endpoint_names: list[str]
    profiles: list[str]  # profile name per engine
    arrival: np.ndarray  # virtual seconds
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ttft_ms)

    def targets(self, kind: ModelKind) -> np.ndarray:
        return self.ttft_ms if check_kind(kind) == "ttft" else self.tpot_ms

    def dataset(
        self, kind: ModelKind, *, schema: FeatureSchema = DEFAULT_SCHEMA
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(X, y_ms)`` of the requests that have a ``kind`` target (every request for TTFT)."""
        y = self.targets(kind)
        keep = np.isfinite(y)
        columns = {name: values[keep] for name, values in self.columns.items()}
        return columns_to_matrix(columns, kind, schema=schema), y[keep]

    def rows(self, indices: np.ndarray | None = None) -> list[dict[str, float]]:
        """Feature rows (both models' features and ``pod_class``) as a router would send them."""
        index = np.arange(len(self)) if indices is None else np.asarray(indices)
        names = list(self.columns)
        data = [self.columns[name][index].tolist() for name in names]
        return [dict(zip(names, values, strict=True)) for values in zip(*data, strict=True)]


class _Router:
    """Per-engine router-side state: in-flight counters, prefix index, last scrape."""

    __slots__ = ("decode_tokens", "gauges", "index", "prefill_tokens")

    def __init__(self) -> None:
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.index: OrderedDict[int, None] = OrderedDict()
        self.gauges = (0.0, 0, 0)  # kv usage, waiting, running


def _capacity_rps(profile: Profile, workload: SimWorkload) -> float:
    """Rough requests/s one engine sustains for this workload (to scale the arrival rate)."""
    prompt_mean = workload.prompt_median * math.exp(workload.prompt_sigma**2 / 2)
    output_mean = workload.output_median * math.exp(workload.output_sigma**2 / 2)
    uncached = prompt_mean * (1.0 - 0.5 * workload.shared_prefix_share)
    batch = 64
    step = (
        max(profile.w_ms, profile.c_lin_ms * batch)
        + profile.c_kv_ms * batch * (prompt_mean + output_mean / 2)
        + profile.c_req_ms * batch
        + profile.c_step_ms
    )
    ms_per_request = uncached * profile.c_lin_ms + output_mean * step / batch
    return 1000.0 / max(ms_per_request, 1e-3)


def _block_hashes(prompt: bytes) -> list[int]:
    hashes = []
    parent = _ROOT
    for offset in range(0, len(prompt) - _BLOCK_BYTES + 1, _BLOCK_BYTES):
        parent = xxhash.xxh3_64_intdigest(prompt[offset : offset + _BLOCK_BYTES], parent)
        hashes.append(parent)
    return hashes


def generate_samples(num_requests: int, *, seed: int = 0, workload: SimWorkload | None = None) -> SimSamples:
    """Simulate ``num_requests`` requests and return one sample row per request (in arrival order)."""
    wl = workload or SimWorkload()
    rng = np.random.default_rng(seed)
    profiles = [get_profile(wl.profiles[i % len(wl.profiles)]) for i in range(wl.num_engines)]
    engines = []
    for i, profile in enumerate(profiles):
        slow = wl.slowdown[i % len(wl.slowdown)]
        if slow != 1.0:
            profile = _slowed(profile, slow)
        engines.append(Engine(profile, seed=seed * 7919 + i))
    routers = [_Router() for _ in engines]
    capacity = sum(_capacity_rps(e.profile, wl) for e in engines)
    prefixes = [
        rng.integers(0, 2**32, int(rng.integers(*wl.prefix_range)), dtype=np.uint32).tobytes()
        for _ in range(wl.num_prefixes)
    ]

    n = num_requests
    cols = {name: np.zeros(n) for name in ALL_FEATURES if name != EFFECTIVE_INPUT_TOKENS}
    cols[POD_CLASS] = np.zeros(n)
    ttft = np.full(n, np.nan)
    tpot = np.full(n, np.nan)
    endpoint = np.zeros(n, dtype=np.int64)
    arrival = np.zeros(n)
    prompt_len = np.zeros(n, dtype=np.int64)
    max_tokens = np.zeros(n, dtype=np.int64)

    events: list[tuple[float, int, int, int]] = []
    counter = 0

    def push(time: float, kind: int, arg: int) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (time, counter, kind, arg))

    busy: list[Any] = [None] * len(engines)
    if wl.scrape_interval_s > 0:
        push(0.0, _SCRAPE, 0)
    push(float(rng.exponential(1.0)) * 0.01, _ARRIVAL, 0)
    phase_end = 0.0
    rate = 0.0
    weights = np.ones(len(engines)) / len(engines)
    codes = [float(pod_class_code(p.name)) for p in profiles]
    finished = 0

    def start_step(e: int, now: float) -> None:
        engine = engines[e]
        step = engine.plan_step(now)
        if step is not None:
            busy[e] = step
            push(step.end, _STEP_END, e)
            return
        ready = engine.next_ready_time()
        if ready is not None:
            push(max(ready, now), _WAKE, e)

    def deliver(e: int, out: StepOutput) -> None:
        nonlocal finished
        router = routers[e]
        for first in out.first_tokens:
            i = _index(first.request_id)
            ttft[i] = first.ttft * 1000.0
            router.prefill_tokens -= int(uncached[i])
            router.decode_tokens += int(prompt_len[i] + max_tokens[i])
        for done in out.finished:
            i = _index(done.request_id)
            if done.output_tokens >= 2:
                tpot[i] = (done.e2e - done.ttft) * 1000.0 / (done.output_tokens - 1)
            router.decode_tokens -= int(prompt_len[i] + max_tokens[i])
            finished += 1

    next_id = 0
    uncached = np.zeros(n, dtype=np.int64)
    while events and finished < n:
        now, _, kind, arg = heapq.heappop(events)
        if kind == _ARRIVAL:
            if now >= phase_end:
                phase_end = now + wl.phase_s
                rate = float(rng.uniform(*wl.load_range)) * capacity
                weights = rng.dirichlet(np.full(len(engines), 2.0))
            i = next_id
            next_id += 1
            e = int(rng.choice(len(engines), p=weights))
            prompt = _prompt(rng, wl, prefixes)
            out_tokens = int(
                np.clip(round(rng.lognormal(math.log(wl.output_median), wl.output_sigma)), 1, wl.output_max)
            )
            cached = _record(cols, i, routers[e], engines[e], wl, prompt, out_tokens, codes[e])
            prompt_len[i] = len(prompt) // BYTES_PER_TOKEN
            max_tokens[i] = out_tokens
            endpoint[i] = e
            arrival[i] = now
            engines[e].add_request(i, prompt, out_tokens, now)
            uncached[i] = prompt_len[i] - cached
            routers[e].prefill_tokens += int(uncached[i])
            ready = engines[e].next_ready_time()
            if busy[e] is None and ready is not None:
                push(max(ready, now), _WAKE, e)
            if next_id < n:
                push(now + float(rng.exponential(1.0 / rate)), _ARRIVAL, 0)
        elif kind == _STEP_END:
            step, busy[arg] = busy[arg], None
            deliver(arg, engines[arg].commit_step(step))
            start_step(arg, now)
        elif kind == _WAKE:
            if busy[arg] is None:
                start_step(arg, now)
        else:
            for router, engine in zip(routers, engines, strict=True):
                router.gauges = (engine.kv_usage, engine.num_waiting, engine.num_running)
            push(now + wl.scrape_interval_s, _SCRAPE, 0)

    return SimSamples(
        columns=cols,
        ttft_ms=ttft,
        tpot_ms=tpot,
        endpoint=endpoint,
        endpoint_names=[f"sim-{i}" for i in range(len(engines))],
        profiles=[p.name for p in profiles],
        arrival=arrival,
        meta={"seed": seed, "capacity_rps": capacity, "virtual_seconds": float(arrival[-1]) if n else 0.0},
    )


def _slowed(profile: Profile, factor: float) -> Profile:
    return replace(
        profile,
        name=f"{profile.name}-x{factor:g}",
        w_ms=profile.w_ms * factor,
        c_lin_ms=profile.c_lin_ms * factor,
        c_attn_ms=profile.c_attn_ms * factor,
        c_kv_ms=profile.c_kv_ms * factor,
        c_req_ms=profile.c_req_ms * factor,
        c_step_ms=profile.c_step_ms * factor,
    )


def _prompt(rng: np.random.Generator, wl: SimWorkload, prefixes: list[bytes]) -> bytes:
    length = int(np.clip(round(rng.lognormal(math.log(wl.prompt_median), wl.prompt_sigma)), 1, wl.prompt_max))
    head = b""
    if prefixes and rng.random() < wl.shared_prefix_share:
        head = prefixes[int(rng.integers(len(prefixes)))][: (wl.prompt_max - 16) * BYTES_PER_TOKEN]
    body = rng.integers(0, 2**32, length, dtype=np.uint32).tobytes()
    return head + body


def _record(
    cols: dict[str, np.ndarray],
    i: int,
    router: _Router,
    engine: Engine,
    wl: SimWorkload,
    prompt: bytes,
    out_tokens: int,
    code: float,
) -> int:
    """Write request ``i``'s feature row; returns the prompt tokens the router expects the engine to hold
    (as the prefix producer's ``cached_prompt_tokens``)."""
    kv, waiting, running = (
        router.gauges
        if wl.scrape_interval_s > 0
        else (engine.kv_usage, engine.num_waiting, engine.num_running)
    )
    hashes = _block_hashes(prompt)
    index = router.index
    matched = 0
    for h in hashes:
        if h not in index:
            break
        matched += 1
    cols[KV_CACHE_PERCENTAGE][i] = kv
    cols[NUM_REQUEST_WAITING][i] = waiting
    cols[NUM_REQUEST_RUNNING][i] = running
    cols[PREFILL_TOKENS_IN_FLIGHT][i] = router.prefill_tokens
    cols[DECODE_TOKENS_IN_FLIGHT][i] = router.decode_tokens
    cols[PREFIX_CACHE_SCORE][i] = matched / len(hashes) if hashes else 0.0
    cols[INPUT_TOKEN_LENGTH][i] = len(prompt) // BYTES_PER_TOKEN
    cols[NUM_TOKENS_GENERATED][i] = out_tokens
    cols[POD_CLASS][i] = code
    for h in hashes:  # the router remembers what it sent (after scoring this request)
        index[h] = None
        index.move_to_end(h)
    while len(index) > wl.prefix_index_blocks:
        index.popitem(last=False)
    return int(cols[INPUT_TOKEN_LENGTH][i]) * matched // len(hashes) if hashes else 0


def _index(request_id: RequestId) -> int:
    """The engines here know each request by its index in the run."""
    assert isinstance(request_id, int)
    return request_id
