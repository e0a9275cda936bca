"""Each policy against itself with ``+slo``, from engine-variant runs (``bench_variants.py --jsonl``).

Per variant, load and policy pair (medians over seeds): TTFT p90 and p99 and SLO attainment without and
with the deadlines, the hedges sent and won, the prefill tokens sent to losing copies over the prefill of
the finished requests, and the deadline cancellations.

    .venv/bin/python benchmarks/summarize_slo_actions.py stragglers.jsonl [more.jsonl ...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

SUFFIX = "+slo"
FIGURES = (
    "ttft_p90_ms",
    "ttft_p99_ms",
    "slo_attainment",
    "goodput_rps",
    "hedges_sent",
    "hedges_won",
    "hedge_extra_prefill",
    "deadline_cancellations",
)


def _median(rows: list[dict[str, Any]], key: str) -> float:
    values = [math.inf if r.get(key) is None else float(r[key]) for r in rows]
    return statistics.median(values) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("jsonl", type=Path, nargs="+")
    args = parser.parse_args()
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = defaultdict(list)
    for path in args.jsonl:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "policy" in row:
                groups[(row["variant"], row["load"], row["policy"])].append(row)
    print(
        "| variant, load | policy | TTFT p90 ms: without / with | TTFT p99 ms: without / with | p99 ratio "
        "| SLO attainment: without / with | hedges sent (won) | extra prefill | cancelled |"
    )
    print("|---|---|---|---|---:|---|---:|---:|---:|")
    ratios = []
    for (variant, load, policy), rows in sorted(groups.items()):
        if policy.endswith(SUFFIX) or (variant, load, policy + SUFFIX) not in groups:
            continue
        base = {k: _median(rows, k) for k in FIGURES}
        kept = {k: _median(groups[(variant, load, policy + SUFFIX)], k) for k in FIGURES}
        ratio = kept["ttft_p99_ms"] / base["ttft_p99_ms"]
        ratios.append((ratio, f"{variant} {load:.0%} {policy}"))
        print(
            f"| {variant}, {load:.0%} | {policy} | {base['ttft_p90_ms']:.0f} / {kept['ttft_p90_ms']:.0f} "
            f"| {base['ttft_p99_ms']:.0f} / {kept['ttft_p99_ms']:.0f} | {ratio:.2f}× "
            f"| {base['slo_attainment']:.3f} / {kept['slo_attainment']:.3f} "
            f"| {kept['hedges_sent']:.0f} ({kept['hedges_won']:.0f}) | {kept['hedge_extra_prefill']:.2%} "
            f"| {kept['deadline_cancellations']:.0f} |"
        )
    if ratios:
        worst, where = max(ratios)
        print(f"\nTTFT p99 with over without: worst {worst:.2f}× ({where}); best {min(ratios)[0]:.2f}×")


if __name__ == "__main__":
    main()
