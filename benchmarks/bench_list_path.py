"""What the plain-Python small-set scoring path (``ListScorer``/``ListPicker`` twins) saves.

For pools of up to 16 candidates, a profile whose scorers and picker all have list twins scores in plain
Python instead of numpy. This measures one scheduling decision (candidate snapshot + producers + scheduler)
of the default profile and of the token-aware warm-up profile, with the list path on and off, interleaved in
rounds so that a change in machine load hits both alike.

    .venv/bin/python benchmarks/bench_list_path.py [--rounds 20] [--requests 500] [--endpoints 2,4,8,16]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import numpy as np

from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling import scheduler as scheduler_module
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext
from slorouter.scheduling.types import Candidates, InferenceRequest

TOKEN_AWARE = {
    "plugins": [
        {"type": "prefix-cache-affinity-filter", "parameters": {"affinityThreshold": 0.8}},
        {"type": "token-load-scorer", "parameters": {"countDecodeTokens": True}},
        {"type": "max-score-picker"},
    ]
}


def decision_times(setup, pool: PoolState, prompts: list[str], rng: np.random.Generator) -> np.ndarray:
    times = np.empty(len(prompts))
    for i, prompt in enumerate(prompts):
        address = pool.endpoints[int(rng.integers(len(pool)))].address
        pool.set_metrics(
            address,
            MetricsSnapshot(
                waiting=int(rng.integers(0, 8)), running=int(rng.integers(0, 32)), kv_usage=rng.random()
            ),
            at=0.0,
        )
        request = InferenceRequest(f"r{i}", "m", prompt, prompt_tokens=len(prompt) // 4, max_tokens=128)
        started = time.perf_counter()
        candidates = Candidates.healthy(pool)
        for producer in setup.data_producers:
            producer.produce(request, candidates)
        result = setup.scheduler.schedule(request, candidates)
        times[i] = time.perf_counter() - started
        for plugin in setup.pre_request:
            plugin.pre_request(request, result)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=500, help="decisions per round and path")
    parser.add_argument("--endpoints", default="2,4,8,16")
    args = parser.parse_args()
    prompts = [f"system prompt {i % 12} " * 40 + f"question {i}" for i in range(args.requests)]
    print(f"`{shlex.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}`\n")
    print("| profile | endpoints | list path p50 (µs) | numpy path p50 (µs) | saved p50 | saved mean |")
    print("|---|---:|---:|---:|---:|---:|")
    default_limit = scheduler_module.LIST_PATH_MAX_CANDIDATES
    for name, config in (("default", None), ("token-aware", TOKEN_AWARE)):
        for n in (int(x) for x in args.endpoints.split(",")):
            samples: dict[bool, list[np.ndarray]] = {True: [], False: []}
            for _ in range(args.rounds):
                for use_list in (True, False):
                    pool = PoolState([Endpoint(f"10.0.0.{i}:8000") for i in range(n)])
                    for e in pool.endpoints:
                        pool.set_metrics(e.address, MetricsSnapshot(kv_usage=0.2), at=0.0)
                    ctx = PluginContext(rng=np.random.default_rng(1), pool=pool)
                    setup = build_scheduler_setup(config, ctx)
                    scheduler_module.LIST_PATH_MAX_CANDIDATES = default_limit if use_list else 0
                    samples[use_list].append(decision_times(setup, pool, prompts, np.random.default_rng(2)))
            scheduler_module.LIST_PATH_MAX_CANDIDATES = default_limit
            on = np.concatenate(samples[True]) * 1e6
            off = np.concatenate(samples[False]) * 1e6
            print(
                f"| {name} | {n} | {np.median(on):.1f} | {np.median(off):.1f} | "
                f"{np.median(off) - np.median(on):.1f} | {off.mean() - on.mean():.1f} |"
            )


if __name__ == "__main__":
    main()
