"""Condense ``slorouter bench --flow-control`` results.json files of the overload scenarios into the tables of
docs/benchmarks.md's "Flow control" section: per policy, the median over seeds (each seed in brackets) of
the figures by priority class or tenant, with the time in the router's queue and the pod-side rest.

    .venv/bin/python benchmarks/summarize_flow_control.py classes RESULTS_DIR [--light LIGHT_DIR]
    .venv/bin/python benchmarks/summarize_flow_control.py tenants RESULTS_DIR --alone ALONE_DIR
    .venv/bin/python benchmarks/summarize_flow_control.py below RESULTS_DIR

``--light``: the same scenario at light load (no burst): the critical TTFT p99 ratio's denominator, per
policy without flow control. ``--alone``: the light tenant alone (``--workload-param tenants=light``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def load(directory: Path) -> list[dict[str, Any]]:
    return json.loads((directory / "results.json").read_text())["runs"]


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "–"
    if math.isinf(value):
        return "∞"
    if isinstance(value, int) or (digits == 0 and (abs(value) >= 100 or float(value).is_integer())):
        return f"{value:,.0f}"
    return f"{value:,.{max(digits, 1)}f}"


def seeds(run: dict[str, Any], key: str) -> str:
    per_seed = run.get("per_seed") or [run]
    return " / ".join(fmt(r.get(key)) for r in per_seed)


def cell(run: dict[str, Any], key: str) -> str:
    return f"{fmt(run.get(key))} ({seeds(run, key)})"


def base_policy(name: str) -> str:
    return name.removesuffix("+fc")


def classes(args: argparse.Namespace) -> None:
    runs = load(args.results)
    light = {r["policy"]: r for r in load(args.light)} if args.light else {}
    print(
        "| policy | non-sheddable TTFT p90 ms (seeds 0 / 1 / 2) | non-sheddable dropped | "
        "critical TTFT p99 ms (seeds) | critical p99 / light load | critical queued p99 ms | "
        "critical pod-side p99 ms | "
        "sheddable dropped | goodput req/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        reference = light.get(base_policy(run["policy"]), {}).get("critical_ttft_p99_ms")
        p99 = run.get("critical_ttft_p99_ms")
        ratio = (
            "–" if not reference or p99 is None else ("∞" if math.isinf(p99) else f"{p99 / reference:.2f}×")
        )
        print(
            f"| {run['policy']} | {cell(run, 'nonsheddable_ttft_p90_ms')} | "
            f"{fmt(run.get('nonsheddable_dropped'))} | {cell(run, 'critical_ttft_p99_ms')} | {ratio} | "
            f"{fmt(run.get('critical_queued_p99_ms'))} | {fmt(run.get('critical_pod_ttft_p99_ms'))} | "
            f"{fmt(run.get('sheddable_dropped'))} | {fmt(run.get('goodput_rps'))} |"
        )


def tenants(args: argparse.Namespace) -> None:
    runs = load(args.results)
    alone = {r["policy"]: r for r in load(args.alone)}
    print(
        "| policy | light tenant TTFT p90 ms, beside heavy (seeds) | light alone (seeds) | ratio | "
        "light queued p90 ms | light pod-side p90 ms | heavy tenant TTFT p90 ms | goodput req/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        solo = alone.get(run["policy"], {})
        beside, ref = run.get("tenant_light_ttft_p90_ms"), solo.get("tenant_light_ttft_p90_ms")
        ratio = "–" if beside is None or not ref else f"{beside / ref:.2f}×"
        print(
            f"| {run['policy']} | {cell(run, 'tenant_light_ttft_p90_ms')} | "
            f"{cell(solo, 'tenant_light_ttft_p90_ms') if solo else '–'} | {ratio} | "
            f"{fmt(run.get('tenant_light_queued_p90_ms'))} | "
            f"{fmt(run.get('tenant_light_pod_ttft_p90_ms'))} | "
            f"{fmt(run.get('tenant_heavy_ttft_p90_ms'))} | {fmt(run.get('goodput_rps'))} |"
        )


def below(args: argparse.Namespace) -> None:
    runs = {r["policy"]: r for r in load(args.results)}
    print(
        "| point | policy | TTFT p90 ms | with +fc | TTFT p99 ms | with +fc | change of p90 | change of p99 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, run in runs.items():
        with_fc = runs.get(name + "+fc")
        if name.endswith("+fc") or with_fc is None:
            continue
        point = f"{run['workload']}, {run['qps']:g} QPS"
        p90, p90_fc = run["ttft_p90_ms"], with_fc["ttft_p90_ms"]
        p99, p99_fc = run["ttft_p99_ms"], with_fc["ttft_p99_ms"]
        print(
            f"| {point} | {name} | {fmt(p90)} | {fmt(p90_fc)} | {fmt(p99)} | {fmt(p99_fc)} | "
            f"{(p90_fc / p90 - 1) * 100:+.1f} % | {(p99_fc / p99 - 1) * 100:+.1f} % |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("table", choices=("classes", "tenants", "below"))
    parser.add_argument("results", type=Path)
    parser.add_argument("--light", type=Path, default=None)
    parser.add_argument("--alone", type=Path, default=None)
    args = parser.parse_args()
    if args.table == "tenants" and args.alone is None:
        parser.error("tenants needs --alone")
    {"classes": classes, "tenants": tenants, "below": below}[args.table](args)


if __name__ == "__main__":
    main()
