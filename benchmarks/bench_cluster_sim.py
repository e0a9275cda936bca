"""Speed of the discrete-event cluster simulator: wall time for a given pool, load and duration.

Cases (each run once per policy, single process, single thread for XGBoost):

1. 16 × qwen3-32b-h100-tp2 pods, 300 virtual seconds of shared-prefix-b at 24 QPS and of maas-mix at
   200 QPS: twice the loads where heuristic-tuned's TTFT p90 stayed under 1 s on 8 such pods (11 and
   100 QPS), i.e. near the 16-pod knee;
2. 100 × llama3-8b-h100 pods, sharegpt at 1,000 QPS for 60 virtual seconds.

    .venv/bin/python benchmarks/bench_cluster_sim.py [--cases 1,2 | --cases 1a,1b,2] [--policies P1,P2]

``cpu s`` is the process's CPU time over the run: on a shared machine it moves much less than the wall
time with the other processes' load, so compare CPU times across sittings and wall times within one.
"""

from __future__ import annotations

import argparse
import time

from slorouter.bench.cluster import ClusterSimulator
from slorouter.bench.policies import resolve_policy
from slorouter.bench.pool import parse_pool
from slorouter.bench.workloads import generate

CASES = {
    "1": [
        ("16x qwen3-32b-h100-tp2", "shared-prefix-b", 24.0, 300.0),
        ("16x qwen3-32b-h100-tp2", "maas-mix", 200.0, 300.0),
    ],
    "2": [("100x llama3-8b-h100", "sharegpt", 1000.0, 60.0)],
}


HEADER = "| pool | workload | QPS | virtual s | requests | policy | wall s | cpu s | steps | trainings |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="1,2", help="1, 2, or one run: 1a (shared-prefix-b), 1b, 2a")
    parser.add_argument("--policies", default="heuristic-tuned,predicted-latency")
    args = parser.parse_args()
    print(HEADER)
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        runs = CASES[case] if case in CASES else [CASES[case[:-1]][ord(case[-1]) - ord("a")]]
        for pool_spec, workload, qps, duration in runs:
            pool = parse_pool(pool_spec)
            requests = generate(
                workload,
                qps=qps,
                duration_s=duration,
                seed=0,
                max_model_len=min(p.max_model_len for p in pool),
            )
            for name in args.policies.split(","):
                policy = resolve_policy(name)
                started, cpu_started = time.perf_counter(), time.process_time()
                with ClusterSimulator.of_policy(pool, policy) as sim:
                    rec = sim.run(requests)
                wall = time.perf_counter() - started
                cpu = time.process_time() - cpu_started
                drain = rec.virtual_s - duration
                print(
                    f"| {pool_spec} | {workload} | {qps:g} | {duration:g} (+{drain:.0f} drain) "
                    f"| {len(requests):,} | {name} | {wall:.1f} | {cpu:.1f} "
                    f"| {rec.steps:,} | {rec.trainings} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
