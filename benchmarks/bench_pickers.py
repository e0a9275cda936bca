"""What several independent picker replicas cost in routing quality, against one picker (virtual time).

Every point (pool, workload, load) runs once per seed × policy × picker setup on the same arrivals:
1 picker, then N pickers with split views (each its own in-flight counts, predictor and prefix index; the
scraped metrics shared), and N pickers sharing their in-flight counts (``--shared-inflight``). Runs go
through ``run_plan``, as ``slorouter bench --pickers N`` does. One line of JSON per run (``--jsonl``);
``--report`` prints the tables: each figure's median over the seeds, its ratio to one picker's median, and
the per-seed ratios' range.

    .venv/bin/python benchmarks/bench_pickers.py --seeds 0,1,2 --jsonl runs.jsonl
    .venv/bin/python benchmarks/bench_pickers.py --points homogeneous --setups 1,4,4s --policies heuristic
    .venv/bin/python benchmarks/bench_pickers.py --report runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from slorouter.bench.cluster import ClusterSettings
from slorouter.bench.policies import resolve_policies
from slorouter.bench.pool import parse_pool
from slorouter.bench.runner import BenchPlan, run_plan

# name → (pool, workload, QPS): realtime-mix at the loads of docs/benchmarks.md (55 QPS ≈ 70 % of the 8
# equal pods' capacity; 40 QPS on the mixed pool).
POINTS: dict[str, tuple[str, str, float]] = {
    "homogeneous": ("8x llama3-8b-h100", "realtime-mix", 55.0),
    "mixed": ("4x llama3-8b-h100 + 4x llama3-8b-h100@slow-gpu", "realtime-mix", 40.0),
}
FIGURES = (("ttft_p90_ms", "TTFT p90"), ("ttft_p99_ms", "TTFT p99"), ("tpot_p50_ms", "TPOT p50"))


def _setup(text: str) -> tuple[int, bool, bool]:
    """``N`` (split views), ``Ns`` (sharing in-flight counts), ``Np`` (sharing the predictor), ``Nsp``."""
    count = text.rstrip("sp")
    return int(count), "s" in text[len(count) :], "p" in text[len(count) :]


def _label(pickers: int, shared: bool, shared_predictor: bool = False) -> str:
    if pickers == 1:
        return "1 picker"
    what = [name for name, on in (("in-flight", shared), ("predictor", shared_predictor)) if on]
    return f"{pickers} pickers" + (f", shared {' + '.join(what)}" if what else "")


def run(args: argparse.Namespace) -> None:
    policies = resolve_policies(args.policies.split(","))
    setups = [_setup(s) for s in args.setups.split(",")]
    out = open(args.jsonl, "a") if args.jsonl else None  # noqa: SIM115 - kept open for the whole grid
    try:
        for name in args.points.split(","):
            pool_spec, workload, qps = POINTS[name]
            for seed in [int(s) for s in args.seeds.split(",")]:
                for pickers, shared, shared_predictor in setups:
                    settings = ClusterSettings(
                        pickers=pickers,
                        shared_inflight=shared,
                        shared_predictor=shared_predictor,
                        picker_assignment=args.assignment,
                        shared_inflight_publishing=args.publishing,
                        shared_inflight_interval_s=args.interval_ms / 1000,
                        shared_inflight_delay_s=args.delay_ms / 1000,
                    )
                    plan = BenchPlan(
                        workloads=[workload],
                        qps=[qps],
                        policies=policies,
                        profiles=parse_pool(pool_spec),
                        duration_s=args.duration,
                        warmup_s=args.warmup,
                        seed=seed,
                        settings=settings,
                    )
                    started = time.perf_counter()
                    for output in run_plan(plan):
                        summary = output.summary
                        row = {
                            "point": name,
                            "setup": _label(pickers, shared, shared_predictor),
                            "pickers": pickers,
                            "shared_inflight": shared,
                            "shared_predictor": shared_predictor,
                            **{k: summary.get(k) for k in ("policy", "seed", "pool", "workload", "qps")},
                            **{k: summary.get(k) for k, _ in FIGURES},
                            "ttft_p50_ms": summary.get("ttft_p50_ms"),
                            "e2e_p50_ms": summary.get("e2e_p50_ms"),
                            "slo_attainment": summary.get("slo_attainment"),
                            "prefix_cache_hit_rate": summary.get("prefix_cache_hit_rate"),
                            "ttft_mape": summary.get("ttft_mape"),
                            "busiest_pod_share": summary.get("busiest_pod_share"),
                            "picker_shares": summary.get("picker_shares"),
                        }
                        line = json.dumps(row)
                        print(line, flush=True)
                        if out is not None:
                            out.write(line + "\n")
                            out.flush()
                    took = time.perf_counter() - started
                    print(
                        f"# {name} seed {seed} {_label(pickers, shared, shared_predictor)}: {took:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        if out is not None:
            out.close()


def report(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines: list[str] = []
    points = list(dict.fromkeys(r["point"] for r in rows))
    for point in points:
        of_point = [r for r in rows if r["point"] == point]
        first = of_point[0]
        seeds = sorted({r["seed"] for r in of_point})
        lines.append(
            f"#### {point}: {first['workload']} at {first['qps']:g} QPS on `{first['pool']}`, "
            f"medians over seeds {', '.join(map(str, seeds))}"
        )
        lines.append("")
        header = ["policy", "setup"]
        for _, title in FIGURES:
            header += [f"{title} ms", f"{title} ratio (per seed)"]
        header += ["prefix hit", "TTFT MAPE"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|---|---|" + "---:|" * (len(header) - 2))
        for policy in dict.fromkeys(r["policy"] for r in of_point):
            of_policy = [r for r in of_point if r["policy"] == policy]
            base = {r["seed"]: r for r in of_policy if r["pickers"] == 1}
            for setup in dict.fromkeys(r["setup"] for r in of_policy):
                runs = {r["seed"]: r for r in of_policy if r["setup"] == setup}
                cells = [policy, setup]
                for key, _ in FIGURES:
                    median = _median([r[key] for r in runs.values()])
                    cells.append(_num(median))
                    if setup == "1 picker" or not base:
                        cells.append("")
                        continue
                    common = [s for s in sorted(runs) if s in base and base[s][key]]
                    if not common:
                        cells.append("–")
                        continue
                    ratio = _median([runs[s][key] for s in common]) / _median([base[s][key] for s in common])
                    per_seed = [runs[s][key] / base[s][key] for s in common]
                    cells.append(f"**{ratio:.2f}×** ({min(per_seed):.2f}–{max(per_seed):.2f})")
                cells.append(_num(_median([r["prefix_cache_hit_rate"] for r in runs.values()]), 3))
                mape = [r["ttft_mape"] for r in runs.values() if r["ttft_mape"] is not None]
                cells.append(_num(_median(mape), 2) if mape else "–")
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _median(values: list[Any]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64)))


def _num(value: float, digits: int | None = None) -> str:
    if digits is not None:
        return f"{value:.{digits}f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=",".join(POINTS), help=f"of {', '.join(POINTS)}")
    parser.add_argument("--policies", default="heuristic,token-aware,predicted-latency")
    parser.add_argument(
        "--setups",
        default="1,2,4,2s,4s",
        help="N: N pickers; Ns: sharing in-flight counts; Np: sharing the predictor; Nsp: both",
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--assignment", default="random", choices=("random", "round-robin"))
    parser.add_argument("--publishing", default="on-change", choices=("on-change", "periodic"))
    parser.add_argument("--interval-ms", type=float, default=50.0, help="heartbeat / publication interval")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="shared in-flight propagation delay")
    parser.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per run")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of a --jsonl file")
    args = parser.parse_args()
    if args.report is not None:
        print(report(args.report))
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
