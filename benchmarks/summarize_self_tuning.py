"""The self-tuning policy against the static ones, point by point, with the targets of docs/self-tuning.md.

Reads the headline runs (``benchmarks/headline.py run DIR --policies ...,self-tuning``) and engine-variant
runs (``benchmarks/bench_variants.py --policies ...,self-tuning --jsonl FILE``) and prints, per point (medians
over seeds): the self-tuning policy's TTFT p90 over the best static policy's (every static policy run at that
point), its TTFT p99 over token-aware's, its TPOT p50 and E2E p50 over predicted-latency's, then the counts
the targets are stated in.

Two more columns say which of those targets a tuner could meet at all. "Best admissible" is the best static
policy among those the default objective lets the tuner switch to from predicted-latency (TPOT p50 and TTFT
p99 within the objective's 2 % tolerance of predicted-latency's); "seeds" counts the seeds on which the best
static policy's TTFT p90 beat predicted-latency's, so a lead that holds on one seed of three is noise a
tuner cannot be expected to follow.

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
CONFIGURED = "predicted-latency"
FIGURES = ("ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "e2e_p50_ms")
TOLERANCE = 1.02  # the default objective's tolerance on the figures it holds steady

Figures = dict[str, float]
Point = tuple[str, bool, dict[str, Figures], dict[str, list[float]]]


def headline_points(directory: Path) -> list[Point]:
    """(label, mixed pool, {policy: figures}, {policy: TTFT p90 per seed}) per point directory, medians over
    its seeds."""
    points = []
    for results in sorted(directory.glob("*/results.json")):
        runs = json.loads(results.read_text())["runs"]
        by_policy = {r["policy"]: {k: float(r[k]) for k in FIGURES} for r in runs}
        if SUBJECT not in by_policy:
            continue
        per_seed = {
            r["policy"]: [float(s["ttft_p90_ms"]) for s in sorted(r["per_seed"], key=lambda s: s["seed"])]
            for r in runs
        }
        pool = runs[0]["pool"]
        label = f"{results.parent.name} ({pool}, {runs[0]['qps']:g} QPS)"
        points.append((label, "+" in pool, by_policy, per_seed))
    return points


def variant_points(paths: list[Path]) -> list[Point]:
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
        per_seed = {
            policy: [float(r["ttft_p90_ms"]) for r in sorted(rows, key=lambda r: r["seed"])]
            for policy, rows in policies.items()
        }
        mixed = "mixed" in variant
        points.append((f"{workload}, {variant}, {load:.0%}", mixed, by_policy, per_seed))
    return points


def admissible(statics: dict[str, Figures]) -> dict[str, Figures]:
    """The static policies the default objective would let the tuner switch to from the configured one."""
    configured = statics.get(CONFIGURED)
    if configured is None:
        return statics
    return {
        policy: figures
        for policy, figures in statics.items()
        if figures["tpot_p50_ms"] <= configured["tpot_p50_ms"] * TOLERANCE
        and figures["ttft_p99_ms"] <= configured["ttft_p99_ms"] * TOLERANCE
    }


def seeds_ahead(per_seed: dict[str, list[float]], best: str) -> str:
    """On how many seeds the best static policy's TTFT p90 beat the configured policy's."""
    if best == CONFIGURED or CONFIGURED not in per_seed:
        return "–"
    mine, configured = per_seed[best], per_seed[CONFIGURED]
    return f"{sum(a < b for a, b in zip(mine, configured, strict=True))}/{len(mine)}"


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
        "predicted-latency | E2E p50 / predicted-latency | TTFT p90 / predicted-latency | seeds best static "
        "led | best admissible | TTFT p90 / best admissible |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
    ratios, admissible_ratios, p99s, tpots, e2es, mixed_losses = [], [], [], [], [], []
    consistent = 0
    for label, mixed, by_policy, per_seed in points:
        mine = by_policy[SUBJECT]
        statics = {p: f for p, f in by_policy.items() if p != SUBJECT}
        best = min(statics, key=lambda p: statics[p]["ttft_p90_ms"])
        ratio = mine["ttft_p90_ms"] / statics[best]["ttft_p90_ms"]
        allowed = admissible(statics)
        best_allowed = min(allowed, key=lambda p: allowed[p]["ttft_p90_ms"])
        allowed_ratio = mine["ttft_p90_ms"] / allowed[best_allowed]["ttft_p90_ms"]
        admissible_ratios.append(allowed_ratio)
        ahead = seeds_ahead(per_seed, best)
        consistent += ahead in ("–", f"{len(per_seed[best])}/{len(per_seed[best])}")
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

        print(
            f"| {label} | {best} | {fmt(ratio)} | {fmt(p99)} | {fmt(tpot)} | {fmt(e2e)} | {fmt(vs_pl)} "
            f"| {ahead} | {best_allowed} | {fmt(allowed_ratio)} |"
        )
    n = len(ratios)
    if not n:
        return
    print()
    print(f"points: {n}")
    print(f"TTFT p90 <= 1.00x the best static: {sum(r <= 1.0 for r in ratios)} of {n} "
          f"({sum(r <= 1.0 for r in ratios) / n:.0%}); <= 1.03x: {sum(r <= 1.03 for r in ratios)}; "
          f"worst {max(ratios):.2f}x")  # fmt: skip
    print(f"points where the best static policy is {CONFIGURED} or led it on every seed: {consistent} of {n}")
    kept = sum(r <= 1.0 for r in admissible_ratios)
    near = sum(r <= 1.03 for r in admissible_ratios)
    print(f"TTFT p90 <= 1.00x the best admissible static: {kept} of {n} ({kept / n:.0%}); "
          f"<= 1.03x: {near}; worst {max(admissible_ratios):.2f}x")  # fmt: skip
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
