"""The self-tuning policy against the static ones, point by point, with the targets of docs/self-tuning.md.

Reads the headline runs (``benchmarks/headline.py run DIR --policies ...,self-tuning``) and engine-variant
runs (``benchmarks/bench_variants.py --policies ...,self-tuning --jsonl FILE``) and prints, per point (medians
over seeds): the self-tuning policy's TTFT p90 over the best static policy's (every static policy run at that
point), its TTFT p99 over token-aware's, its TPOT p50 and E2E p50 over predicted-latency's, then the counts
the targets are stated in.

    .venv/bin/python benchmarks/summarize_self_tuning.py --headline results/headline \
        --variants results/variants-new-user.jsonl results/variants-realtime-mix.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

SUBJECT = "self-tuning"
FIGURES = ("ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "e2e_p50_ms")


def headline_points(directory: Path) -> list[tuple[str, bool, dict[str, dict[str, float]]]]:
    """(label, mixed pool, {policy: figures}) per point directory, medians over its seeds."""
    points = []
    for results in sorted(directory.glob("*/results.json")):
        runs = json.loads(results.read_text())["runs"]
        by_policy = {r["policy"]: {k: float(r[k]) for k in FIGURES} for r in runs}
        if SUBJECT not in by_policy:
            continue
        pool = runs[0]["pool"]
        points.append((f"{results.parent.name} ({pool}, {runs[0]['qps']:g} QPS)", "+" in pool, by_policy))
    return points


def variant_points(paths: list[Path]) -> list[tuple[str, bool, dict[str, dict[str, float]]]]:
    groups: dict[tuple[str, str, float], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    workloads: dict[Path, str] = {}
    for path in paths:
        workloads[path] = path.stem.removeprefix("variants-")
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "policy" in row and "ttft_p90_ms" in row:
                groups[(workloads[path], row["variant"], row["load"])][row["policy"]].append(row)
    points = []
    for (workload, variant, load), policies in groups.items():
        if SUBJECT not in policies:
            continue
        by_policy = {
            policy: {k: statistics.median(float(r[k]) for r in rows) for k in FIGURES}
            for policy, rows in policies.items()
        }
        mixed = "mixed" in variant
        points.append((f"{workload}, {variant}, {load:.0%}", mixed, by_policy))
    return points


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--headline", type=Path, default=None)
    parser.add_argument("--variants", type=Path, nargs="*", default=[])
    args = parser.parse_args()
    points = (headline_points(args.headline) if args.headline else []) + variant_points(args.variants)
    print(
        "| point | best static | self-tuning TTFT p90 / best | TTFT p99 / token-aware | TPOT p50 / "
        "predicted-latency | E2E p50 / predicted-latency | TTFT p90 / predicted-latency |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    ratios, p99s, tpots, e2es, mixed_losses = [], [], [], [], []
    for label, mixed, by_policy in points:
        mine = by_policy[SUBJECT]
        statics = {p: f for p, f in by_policy.items() if p != SUBJECT}
        best = min(statics, key=lambda p: statics[p]["ttft_p90_ms"])
        ratio = mine["ttft_p90_ms"] / statics[best]["ttft_p90_ms"]
        p99 = (
            mine["ttft_p99_ms"] / statics["token-aware"]["ttft_p99_ms"] if "token-aware" in statics else None
        )
        pl = statics.get("predicted-latency")
        tpot = mine["tpot_p50_ms"] / pl["tpot_p50_ms"] if pl else None
        e2e = mine["e2e_p50_ms"] / pl["e2e_p50_ms"] if pl else None
        vs_pl = mine["ttft_p90_ms"] / pl["ttft_p90_ms"] if pl else None
        ratios.append(ratio)
        if p99 is not None:
            p99s.append(p99)
        if tpot is not None and e2e is not None:
            tpots.append(tpot)
            e2es.append(e2e)
        if mixed and vs_pl is not None and vs_pl > 1.0:
            mixed_losses.append((label, vs_pl))

        def fmt(x: float | None) -> str:
            return "–" if x is None else f"{x:.2f}×"

        print(f"| {label} | {best} | {fmt(ratio)} | {fmt(p99)} | {fmt(tpot)} | {fmt(e2e)} | {fmt(vs_pl)} |")
    n = len(ratios)
    if not n:
        return
    print()
    print(f"points: {n}")
    print(f"TTFT p90 <= 1.00x the best static: {sum(r <= 1.0 for r in ratios)} of {n} "
          f"({sum(r <= 1.0 for r in ratios) / n:.0%}); <= 1.03x: {sum(r <= 1.03 for r in ratios)}; "
          f"worst {max(ratios):.2f}x")  # fmt: skip
    if p99s:
        kept = sum(r <= 1.10 for r in p99s)
        print(f"TTFT p99 <= 1.10x token-aware's: {kept} of {len(p99s)}; worst {max(p99s):.2f}x")
    if tpots:
        for name, values in (("TPOT p50", tpots), ("E2E p50", e2es)):
            kept = sum(r <= 1.0 for r in values)
            print(f"{name} <= predicted-latency's: {kept} of {len(values)}; worst {max(values):.2f}x")
    print(f"mixed-pool points worse than predicted-latency: {mixed_losses or 'none'}")


if __name__ == "__main__":
    main()
