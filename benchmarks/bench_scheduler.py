"""Scheduling decision time of the built-in default profile.

Measures, per request, the candidate snapshot + data producers (prefix hashing and index lookup) + the
scheduler (queue ×2, kv-cache ×2, prefix-cache ×3, max-score picker), on pools of 16 and 100 endpoints.
The pre-request hook (inserting the request's blocks into the prefix index) runs after the decision and is
reported separately. Prompts mix ~200-character chats and ~4,000-character prompts that share one of a
few long system prompts; a warm-up pass fills the prefix index first. Load signals change between requests
as a scraper would change them.

    .venv/bin/python benchmarks/bench_scheduler.py [--requests N] [--endpoints 16,100] [--json PATH] [--audit]

``--audit``: each decision also keeps its pick record (``audit`` in the router's YAML) and computes its
routing regret and the scores header (8 candidates), as a router with ``audit.regret`` and
``audit.scores_header`` does.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling.loader import SchedulerSetup, build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext
from slorouter.scheduling.regret import regret_of
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest
from slorouter.serving.scores_header import pick_scores

TARGET_P99_MS = 0.5
AUDIT_LISTED = 8  # audit.scores_max_candidates' default
LONG_PROMPT_SHARE = 0.5
SYSTEM_PROMPTS = 24
SYSTEM_PROMPT_CHARS = 3_800
TAIL_CHARS = 200


@dataclass
class Result:
    endpoints: int
    requests: int
    decision_p50_ms: float
    decision_p99_ms: float
    decision_mean_ms: float
    pre_request_p50_ms: float
    pre_request_p99_ms: float
    mean_prefix_blocks: float


def random_text(rng: np.random.Generator, chars: int, vocabulary: list[str]) -> str:
    words = rng.choice(vocabulary, size=chars // 5 + 8)
    return " ".join(words)[:chars]


def make_prompts(rng: np.random.Generator, count: int) -> list[str]:
    letters = list("abcdefghijklmnopqrstuvwxyz")
    vocabulary = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(3000)]
    systems = [random_text(rng, SYSTEM_PROMPT_CHARS, vocabulary) for _ in range(SYSTEM_PROMPTS)]
    prompts = []
    for _ in range(count):
        tail = random_text(rng, TAIL_CHARS, vocabulary)
        if rng.random() < LONG_PROMPT_SHARE:
            prompts.append(systems[rng.integers(SYSTEM_PROMPTS)] + tail)
        else:
            prompts.append(tail)
    return prompts


def make_pool(n: int, rng: np.random.Generator) -> PoolState:
    pool = PoolState([Endpoint(f"10.0.{i // 250}.{i % 250 + 1}:8000") for i in range(n)])
    for endpoint in pool.endpoints:
        scrape(pool, endpoint.address, rng)
    return pool


def scrape(pool: PoolState, address: str, rng: np.random.Generator) -> None:
    snapshot = MetricsSnapshot(
        waiting=int(rng.integers(0, 12)),
        running=int(rng.integers(0, 64)),
        kv_usage=float(rng.random()),
        block_size=16,
        num_gpu_blocks=30_000,
    )
    pool.set_metrics(address, snapshot, at=0.0)


def request_for(i: int, prompt: str) -> InferenceRequest:
    return InferenceRequest(
        request_id=str(i), model="llama", prompt_text=prompt, prompt_tokens=len(prompt) // 4, max_tokens=128
    )


def run_one(
    setup: SchedulerSetup, pool: PoolState, request: InferenceRequest, audit: bool = False
) -> tuple[int, int]:
    """One request through producers, scheduler and pre-request; returns (decision ns, pre-request ns)."""
    started = time.perf_counter_ns()
    candidates = Candidates.healthy(pool)
    for producer in setup.data_producers:
        producer.produce(request, candidates)
    result = setup.scheduler.schedule(request, candidates, CycleState(record=audit))
    if result.record is not None:
        regret_of(result.record)
        pick_scores(result.record, AUDIT_LISTED)
    decided = time.perf_counter_ns()
    for hook in setup.pre_request:
        hook.pre_request(request, result)
    return decided - started, time.perf_counter_ns() - decided


def bench(endpoints: int, requests: int, warmup: int, seed: int, audit: bool = False) -> Result:
    rng = np.random.default_rng(seed)
    pool = make_pool(endpoints, rng)
    setup = build_scheduler_setup(None, PluginContext(rng=np.random.default_rng(seed), pool=pool))
    prompts = make_prompts(rng, warmup + requests)
    addresses = [e.address for e in pool.endpoints]
    decision_ns = np.zeros(requests, dtype=np.int64)
    pre_request_ns = np.zeros(requests, dtype=np.int64)
    matched_blocks = []
    for i, prompt in enumerate(prompts):
        scrape(pool, addresses[i % endpoints], rng)  # the scraper refreshes one endpoint per request
        request = request_for(i, prompt)
        decision, pre_request = run_one(setup, pool, request, audit)
        if i >= warmup:
            decision_ns[i - warmup] = decision
            pre_request_ns[i - warmup] = pre_request
            state = next(iter(request.state.values()))
            matched_blocks.append(max(state.matched.values(), default=0))
    ms = 1e-6
    return Result(
        endpoints=endpoints,
        requests=requests,
        decision_p50_ms=float(np.percentile(decision_ns, 50)) * ms,
        decision_p99_ms=float(np.percentile(decision_ns, 99)) * ms,
        decision_mean_ms=float(decision_ns.mean()) * ms,
        pre_request_p50_ms=float(np.percentile(pre_request_ns, 50)) * ms,
        pre_request_p99_ms=float(np.percentile(pre_request_ns, 99)) * ms,
        mean_prefix_blocks=float(np.mean(matched_blocks)),
    )


def markdown(results: list[Result], command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        "| endpoints | requests | decision p50 (ms) | decision p99 (ms) | decision mean (ms) "
        "| pre-request p50 (ms) | pre-request p99 (ms) | best prefix match (blocks, mean) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.endpoints} | {r.requests} | {r.decision_p50_ms:.3f} | {r.decision_p99_ms:.3f} "
            f"| {r.decision_mean_ms:.3f} | {r.pre_request_p50_ms:.3f} | {r.pre_request_p99_ms:.3f} "
            f"| {r.mean_prefix_blocks:.1f} |"
        )
    lines.append("")
    lines.append(f"Target: decision p99 ≤ {TARGET_P99_MS} ms at 100 endpoints.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000, help="measured requests per pool size")
    parser.add_argument("--warmup", type=int, default=2000, help="requests that fill the prefix index first")
    parser.add_argument("--endpoints", default="16,100", help="comma-separated pool sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results as JSON to this path")
    parser.add_argument("--audit", action="store_true", help="keep pick records, compute regret and scores")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.endpoints.split(",")]
    results = [bench(n, args.requests, args.warmup, args.seed, args.audit) for n in sizes]
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join([".venv/bin/python", "benchmarks/bench_scheduler.py", *given])
    print(markdown(results, command))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump([asdict(r) for r in results], out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
