"""Precise prefix routing when KV-event batches are lost, with the index's trust states against without
(virtual time, ``slorouter bench``'s discrete-event cluster).

Each lost batch is a gap the replay cannot fill: the pod's blocks are cleared at its next batch. Without
the trust states the precise producer reads the cleared (refilling) index at once; with them the pod is
``rebuilding`` and routed on the approximate estimate until ``kv_events_rebuild_events`` events or
``kv_events_rebuild_ms``. Every arm runs on the same arrivals per seed; the table gives each figure's
median over the seeds, and the approximate policy (no KV events) and the precise one without drops as
references.

    .venv/bin/python benchmarks/bench_kv_trust.py --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from _harness import markdown_table
from slorouter.bench.cluster import ClusterSettings
from slorouter.bench.policies import resolve_policies
from slorouter.bench.pool import parse_pool
from slorouter.bench.runner import BenchPlan, run_plan
from slorouter.pool.kv_trust import TrustThresholds

FIGURES = ("ttft_p90_ms", "ttft_p99_ms", "prefix_cache_hit_rate")


def run_arm(
    args: argparse.Namespace, policy: str, seed: int, drop: float, trust: TrustThresholds | None
) -> dict[str, Any]:
    plan = BenchPlan(
        workloads=[args.workload],
        qps=[args.qps],
        policies=resolve_policies([policy]),
        profiles=parse_pool(args.pool),
        duration_s=args.duration,
        warmup_s=args.warmup,
        seed=seed,
        settings=ClusterSettings(kv_event_drop=drop, kv_trust=trust),
    )
    (output,) = list(run_plan(plan))
    return {key: output.summary.get(key) for key in FIGURES}


def _rebuild(text: str) -> TrustThresholds:
    events, _, seconds = text.partition("/")
    return TrustThresholds(rebuild_events=int(events), rebuild_s=float(seconds))


def cell(runs: list[dict[str, Any]], key: str) -> str:
    values = [run[key] for run in runs]
    median = statistics.median(values)
    if key == "prefix_cache_hit_rate":
        return f"{median:.3f}"
    return f"{median:,.0f} ({' / '.join(f'{v:,.0f}' for v in values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="high-churn")
    parser.add_argument("--pool", default="8x qwen3-32b-h100-tp2")
    parser.add_argument("--qps", type=float, default=6.0)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--policy", default="token-aware", help="a pipeline with a -precise variant")
    parser.add_argument("--drops", default="0.01,0.1,0.5", help="shares of the KV-event batches lost")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--rebuilds",
        default="1000/30",
        help="EVENTS/SECONDS of the trust's rebuild, one arm each, comma-separated",
    )
    parser.add_argument("--no-references", action="store_true", help="leave out the runs without drops")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    precise = f"{args.policy}-precise"
    rows: list[list[object]] = []

    def arm(label: str, policy: str, drop: float, trust: TrustThresholds | None) -> list[dict[str, Any]]:
        runs = [run_arm(args, policy, seed, drop, trust) for seed in seeds]
        print(f"# {label}: {runs}", file=sys.stderr, flush=True)
        return runs

    rebuilds = [_rebuild(text) for text in args.rebuilds.split(",")]
    if not args.no_references:
        reference = arm("approximate", args.policy, 0.0, None)
        rows.append([f"{args.policy} (approximate)", "–", *(cell(reference, k) for k in FIGURES)])
        whole = arm("precise, no drop", precise, 0.0, None)
        rows.append([f"{precise}, no drop", "–", *(cell(whole, k) for k in FIGURES)])
    for drop in [float(d) for d in args.drops.split(",")]:
        arms: list[tuple[str, TrustThresholds | None]] = [("without", None)]
        arms += [(f"with, rebuilt after {t.rebuild_events} events or {t.rebuild_s:g} s", t) for t in rebuilds]
        for label, trust in arms:
            runs = arm(f"drop {drop} {label}", precise, drop, trust)
            rows.append([f"{precise}, {drop:.1%} dropped", label, *(cell(runs, k) for k in FIGURES)])
    headers = ["policy", "trust states", "TTFT p90 ms (seeds)", "TTFT p99 ms (seeds)", "prefix hit"]
    print(f"{args.workload} at {args.qps:g} QPS on `{args.pool}`, medians of seeds {args.seeds}\n")
    print(markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
