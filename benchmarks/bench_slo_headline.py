"""Hedging where pods behave: the headline points with and without ``+slo``, every request with a TTFT SLO.

Hedges should rarely fire on a healthy pool and cost nothing when they do. Each headline point
(``benchmarks/headline.py``) runs ``predicted-latency`` and ``predicted-latency+slo`` (the deadlines file
given, by default hedging only) on the same arrivals, with every request's TTFT SLO set to
``predicted-latency``'s own TTFT p90 at that point, read from an earlier headline run (so about one request
in ten is late without hedging: a tight SLO, where hedges fire most). ``realtime-mix`` points keep the
workload's own per-class SLOs (200 ms chat, 600 ms long context).

    .venv/bin/python benchmarks/bench_slo_headline.py run OUT --slo-from HEADLINE_DIR [--seeds 0,1,2]
        [--points NAME,...] [--deadlines benchmarks/deadlines/hedge-only.yaml]
    .venv/bin/python benchmarks/bench_slo_headline.py table OUT

The table gives each ratio twice: of the medians over seeds, and paired (the median of each seed's ratio,
with their range): both sides of a seed see the same arrivals, so the paired ratio is not thrown by a seed
whose tail is long with and without hedging.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from headline import POINTS, Point

BASE = "predicted-latency"
HEDGED = BASE + "+slo"
OWN_SLOS = {"realtime-mix"}  # workloads whose requests carry their own SLOs
DEADLINES = Path(__file__).parent / "deadlines" / "hedge-only.yaml"


def slo_of(point: Point, slo_from: Path) -> float | None:
    """The point's SLO: predicted-latency's TTFT p90 (median over seeds) in the earlier run; None: the
    workload's own."""
    if point.workload in OWN_SLOS:
        return None
    runs = json.loads((slo_from / point.name / "results.json").read_text())["runs"]
    return round(next(r["ttft_p90_ms"] for r in runs if r["policy"] == BASE), 1)


def command(point: Point, slo_ms: float | None, seeds: str, deadlines: Path, out: Path) -> list[str]:
    args = [
        sys.executable, "-c", "import sys; from slorouter.cli import main; sys.exit(main())", "bench",
        "--workload", point.workload, "--pool", point.pool, "--qps", f"{point.qps:g}",
        "--duration", str(point.duration), "--warmup", str(point.warmup), "--seeds", seeds,
        "--policies", f"{BASE},{HEDGED}", "--deadlines-config", str(deadlines), "--no-progress",
        "--out", str(out / point.name),
    ]  # fmt: skip
    if slo_ms is not None:
        args += ["--workload-param", f"slo_ttft_ms={slo_ms:g}"]
    return args


def run(args: argparse.Namespace) -> None:
    chosen = set(args.points.split(",")) if args.points else None
    for point in POINTS:
        if chosen is not None and point.name not in chosen:
            continue
        slo = slo_of(point, args.slo_from)
        cmd = command(point, slo, args.seeds, args.deadlines, args.out)
        print("$ " + shlex.join(cmd[3:]), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (args.out / point.name / "slo.json").write_text(json.dumps({"slo_ttft_ms": slo}))


def _seeds(run: dict[str, Any], key: str) -> list[float]:
    return [float(s[key]) for s in run["per_seed"]]


def _paired(base: dict[str, Any], hedged: dict[str, Any], key: str) -> tuple[float, float, float]:
    """The median over seeds of each seed's with/without ratio (the same arrivals on both sides), and the
    smallest and largest of them."""
    ratios = [w / b for b, w in zip(_seeds(base, key), _seeds(hedged, key), strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def table(out: Path) -> None:
    print(
        "| point | SLO ms | TTFT p90 ms: without / with hedging | ratio | paired (seeds) "
        "| TTFT p99 ms: without / with | ratio | paired (seeds) | SLO attainment: without / with "
        "| hedges sent (won) | extra prefill |"
    )
    print("|---|---:|---|---:|---|---|---:|---|---|---:|---:|")
    worst = worst_paired = 0.0
    for point in POINTS:
        path = out / point.name / "results.json"
        if not path.exists():
            continue
        runs = {r["policy"]: r for r in json.loads(path.read_text())["runs"]}
        base, hedged = runs[BASE], runs[HEDGED]
        p90 = hedged["ttft_p90_ms"] / base["ttft_p90_ms"]
        p99 = hedged["ttft_p99_ms"] / base["ttft_p99_ms"]
        worst = max(worst, p90, p99)
        paired = {key: _paired(base, hedged, key) for key in ("ttft_p90_ms", "ttft_p99_ms")}
        worst_paired = max(worst_paired, paired["ttft_p90_ms"][0], paired["ttft_p99_ms"][0])
        seeds = {key: f"{m:.2f}× ({lo:.2f}–{hi:.2f})" for key, (m, lo, hi) in paired.items()}
        sent = statistics.median(_seeds(hedged, "hedges_sent"))
        won = statistics.median(_seeds(hedged, "hedges_won"))
        extra = statistics.median(_seeds(hedged, "hedge_extra_prefill"))
        slo = json.loads((out / point.name / "slo.json").read_text())["slo_ttft_ms"]
        label = "own" if slo is None else f"{slo:g}"
        print(
            f"| {point.name} | {label} "
            f"| {base['ttft_p90_ms']:.0f} / {hedged['ttft_p90_ms']:.0f} | {p90:.2f}× "
            f"| {seeds['ttft_p90_ms']} "
            f"| {base['ttft_p99_ms']:.0f} / {hedged['ttft_p99_ms']:.0f} | {p99:.2f}× "
            f"| {seeds['ttft_p99_ms']} "
            f"| {base['slo_attainment']:.3f} / {hedged['slo_attainment']:.3f} | {sent:.0f} ({won:.0f}) "
            f"| {extra:.2%} |"
        )
    print(
        f"\nworst ratio (TTFT p90 or p99, with over without hedging): {worst:.3f}× of the medians, "
        f"{worst_paired:.3f}× paired"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("out", type=Path)
    run_parser.add_argument(
        "--slo-from", type=Path, required=True, help="an earlier headline.py run's OUT_DIR"
    )
    run_parser.add_argument("--seeds", default="0,1,2")
    run_parser.add_argument("--points", default="")
    run_parser.add_argument("--deadlines", type=Path, default=DEADLINES)
    table_parser = sub.add_parser("table")
    table_parser.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.what == "run":
        run(args)
    else:
        table(args.out)


if __name__ == "__main__":
    main()
