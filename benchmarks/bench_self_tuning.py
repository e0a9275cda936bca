"""The self-tuning policy when the workload changes half-way, in virtual time, beside static policies.

The first half of the run is one workload, the second another (default: ``new-user`` then ``maas-mix`` on 4
H100 pods), each at its own rate, on the same pods. Every policy gets the same arrivals. Reported per
policy, medians over the seeds: TTFT p90 of each half after its first ``--settle`` seconds (the first half
also after the run's warm-up), TPOT p50 and E2E p50 of the second half, and for the self-tuning policy its
switches (when, to what), how long after the change its active candidate was last switched, and the worst
10-second window's TTFT p90 in the minute after a switch over the 10 seconds before it.

    .venv/bin/python benchmarks/bench_self_tuning.py [--seeds 0,1,2] [--half 180] [--json out.json]
        [--first new-user --first-qps 31.4 --second maas-mix --second-qps 60 --pool "4x llama3-8b-h100"]
        [--policies predicted-latency,token-aware,least-request,self-tuning]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import numpy as np

from slorouter.bench.cluster import ClusterSimulator
from slorouter.bench.policies import resolve_policy
from slorouter.bench.pool import parse_pool
from slorouter.bench.results import post_switch_worst_ratio
from slorouter.bench.workloads import generate
from slorouter.bench.workloads.request import BenchRequest

WARMUP_S = 30.0


def phase_change(args: argparse.Namespace, seed: int) -> list[BenchRequest]:
    profiles = parse_pool(args.pool)
    max_len = min(p.max_model_len for p in profiles)
    first = generate(
        args.first, qps=args.first_qps, duration_s=args.half, seed=seed, params={}, max_model_len=max_len
    )
    second = generate(
        args.second,
        qps=args.second_qps,
        duration_s=args.half,
        seed=seed + 1,
        params={},
        max_model_len=max_len,
    )
    shifted = [
        BenchRequest(
            r.arrival + args.half,
            r.prompt,
            r.max_tokens,
            r.session,
            r.slo_ttft_ms,
            r.slo_tpot_ms,
            r.priority,
            r.tenant,
        )
        for r in second
    ]
    return [*first, *shifted]


def run(args: argparse.Namespace, policy_spec: str, seed: int) -> dict[str, Any]:
    policy = resolve_policy(policy_spec)
    requests = phase_change(args, seed)
    started = time.perf_counter()
    with ClusterSimulator(
        parse_pool(args.pool),
        policy.config,
        use_predictor=policy.uses_predictor,
        seed=seed,
        tuning=policy.tuning,
    ) as sim:
        rec = sim.run(requests)
    ttft = np.where(np.isnan(rec.ttft_s), np.inf, rec.ttft_s) * 1000.0
    tpot = rec.tpot_ms
    e2e = np.where(np.isnan(rec.e2e_s), np.inf, rec.e2e_s) * 1000.0
    half, settle = args.half, args.settle

    def p(values: np.ndarray, q: float) -> float:
        values = values[~np.isnan(values)]
        return float(np.quantile(values, q, method="inverted_cdf")) if len(values) else math.nan

    first = (rec.arrival >= max(WARMUP_S, settle)) & (rec.arrival < half)
    second = rec.arrival >= half + settle
    out: dict[str, Any] = {
        "policy": policy.name,
        "seed": seed,
        "first_ttft_p90_ms": p(ttft[first], 0.9),
        "second_ttft_p90_ms": p(ttft[second], 0.9),
        "second_ttft_p99_ms": p(ttft[second], 0.99),
        "second_tpot_p50_ms": p(tpot[second], 0.5),
        "second_e2e_p50_ms": p(e2e[second], 0.5),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    rounds = rec.facts.get("tuning")
    if rounds is not None:
        switches = [(r["at"], r["switch_to"]) for r in rounds if r["switch_to"] is not None]
        out["switches"] = switches
        after = [at for at, _ in switches if at >= half]
        out["last_switch_after_change_s"] = (max(after) - half) if after else None
        out["post_switch_worst_ratio"] = post_switch_worst_ratio(rec, [at for at, _ in switches])
        out["active_at_end"] = switches[-1][1] if switches else "predicted-latency"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--pool", default="4x llama3-8b-h100")
    parser.add_argument("--first", default="new-user")
    parser.add_argument("--first-qps", type=float, default=31.4)
    parser.add_argument("--second", default="maas-mix")
    parser.add_argument("--second-qps", type=float, default=60.0)
    parser.add_argument("--half", type=float, default=180.0, help="seconds of each workload")
    parser.add_argument(
        "--settle", type=float, default=60.0, help="seconds of each half not measured (two tuning periods)"
    )
    parser.add_argument("--policies", default="predicted-latency,token-aware,least-request,self-tuning")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    runs = []
    for seed in seeds:
        for spec in args.policies.split(","):
            result = run(args, spec, seed)
            print(json.dumps(result), flush=True)
            runs.append(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    keys = (
        "first_ttft_p90_ms",
        "second_ttft_p90_ms",
        "second_ttft_p99_ms",
        "second_tpot_p50_ms",
        "second_e2e_p50_ms",
    )
    print(
        f"\n{args.first} at {args.first_qps:g} QPS for {args.half:g} s, then {args.second} at "
        f"{args.second_qps:g} QPS for {args.half:g} s, {args.pool}; medians of seeds {args.seeds}; each half "
        f"measured after its first {args.settle:g} s\n"
    )
    print("| policy | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for spec in args.policies.split(","):
        name = resolve_policy(spec).name
        mine = [r for r in runs if r["policy"] == name]
        print(
            f"| {name} | " + " | ".join(f"{statistics.median(r[k] for r in mine):.1f}" for k in keys) + " |"
        )
    for r in runs:
        if "switches" in r:
            print(
                f"self-tuning seed {r['seed']}: switches {r['switches']}; last switch "
                f"{r['last_switch_after_change_s']} s after the change; worst post-switch window "
                f"{r['post_switch_worst_ratio']}x"
            )


if __name__ == "__main__":
    main()
