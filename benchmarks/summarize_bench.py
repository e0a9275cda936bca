"""Condense ``slorouter bench`` results.json files into the TTFT p90 comparison of docs/benchmarks.md.

    .venv/bin/python benchmarks/summarize_bench.py RESULTS_DIR [RESULTS_DIR ...]

One row per (workload, load): TTFT p90 of every policy, then predicted-latency's ratio to heuristic-tuned
and to the best other policy at that load (below 1: predicted-latency is better).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from slorouter.bench.policies import POLICY_NAMES

POLICIES = list(POLICY_NAMES)  # every built-in policy of `slorouter bench`, in its order


def fmt(value: float | None) -> str:
    if value is None:
        return "–"
    if math.isinf(value):
        return "∞"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def main() -> None:
    runs = []
    for directory in sys.argv[1:]:
        runs += json.loads((Path(directory) / "results.json").read_text())["runs"]
    groups: dict[tuple[str, float], dict[str, dict]] = {}
    for run in runs:
        groups.setdefault((run["workload"], run["qps"]), {})[run["policy"]] = run
    print("| workload | QPS | " + " | ".join(POLICIES) + " | pred / tuned | pred / best other |")
    print("|---|---:|" + "---:|" * len(POLICIES) + "---:|---:|")
    for (workload, qps), by_policy in groups.items():
        p90 = {name: by_policy[name]["ttft_p90_ms"] for name in POLICIES if name in by_policy}
        pred = p90.get("predicted-latency")
        others = [v for k, v in p90.items() if k != "predicted-latency" and v is not None]
        tuned = p90.get("heuristic-tuned")
        ratio_tuned = f"{pred / tuned:.2f}×" if pred and tuned and not math.isinf(tuned) else "–"
        best = min(others) if others else None
        ratio_best = f"{pred / best:.2f}×" if pred and best and not math.isinf(best) else "–"
        cells = " | ".join(fmt(p90.get(name)) for name in POLICIES)
        print(f"| {workload} | {qps:g} | {cells} | {ratio_tuned} | {ratio_best} |")


if __name__ == "__main__":
    main()
