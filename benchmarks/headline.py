"""The headline comparison of docs/benchmarks.md: every built-in policy on every workload, in virtual time.

    .venv/bin/python benchmarks/headline.py run OUT_DIR [--seeds 0,1,2] [--points NAME,...] [--policies P,...]
    .venv/bin/python benchmarks/headline.py table OUT_DIR
    .venv/bin/python benchmarks/headline.py plot OUT_DIR docs/img/headline-ttft-p90.png
    .venv/bin/python benchmarks/headline.py accuracy OUT_DIR
    .venv/bin/python benchmarks/headline.py regret OUT_DIR

``run`` calls ``slorouter bench`` once per point (a workload, a pool and one load below saturation), every
built-in policy on the same arrivals, and writes ``OUT_DIR/NAME/results.json``. ``table`` prints the
Markdown table of the results page (TTFT p90 of every policy, the median over the seeds with their range,
and each point's best policy); ``plot`` draws it, TTFT p90 relative to the best policy at each point;
``accuracy`` prints predicted-latency's prediction quality at each point; ``regret`` each policy's routing
regret at each point (docs/routing-audit.md): the share of the reachable prefix reuse it achieved and the
avoidable prefill tokens per second, in the pool's view (the engines' caches at each pick) and the
router's (its own prefix index; – for a policy without one). The runs are deterministic: the
same command gives the same figures on any machine.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

from slorouter.bench.policies import POLICY_NAMES

POLICIES = list(POLICY_NAMES)  # every built-in policy of `slorouter bench`, in its order

QWEN8 = "8x qwen3-32b-h100-tp2"


class Point(NamedTuple):
    name: str
    workload: str
    pool: str
    qps: float
    duration: int = 120
    warmup: int = 30


# One load per workload: the higher of the two below-saturation loads of the per-workload sweeps
# (docs/benchmarks.md, "Routing quality in virtual time"), new-user and realtime-mix at 75 % and 70 % of
# their pools' capacity.
POINTS = [
    Point("sharegpt", "sharegpt", QWEN8, 100),
    Point("shared-prefix-a", "shared-prefix-a", QWEN8, 40),
    Point("shared-prefix-b", "shared-prefix-b", QWEN8, 11),
    Point("shared-prefix-c", "shared-prefix-c", QWEN8, 7.5),
    Point("shared-prefix-d", "shared-prefix-d", QWEN8, 5),
    Point("b2b-saas", "b2b-saas", QWEN8, 7.5),
    Point("high-churn", "high-churn", QWEN8, 6),
    Point("code-generation", "code-generation", QWEN8, 3.4),
    Point("reasoning", "reasoning", QWEN8, 3.4),
    Point("maas-mix", "maas-mix", QWEN8, 100),
    Point("maas-mix-h100-a100", "maas-mix", "4x llama3-8b-h100 + 4x llama3-8b-a100", 150),
    Point("new-user", "new-user", "4x llama3-8b-h100", 31.4, 90, 30),
    Point("new-user-slow-gpu", "new-user", "2x llama3-8b-h100 + 2x llama3-8b-h100@slow-gpu", 22.0, 90, 30),
    Point("realtime-mix", "realtime-mix", "8x llama3-8b-h100", 55),
    Point("realtime-mix-slow-gpu", "realtime-mix", "4x llama3-8b-h100 + 4x llama3-8b-h100@slow-gpu", 40),
]

# Pools with two kinds of pod, marked in the table and the plot.
MIXED = {"maas-mix-h100-a100", "new-user-slow-gpu", "realtime-mix-slow-gpu"}


def bench_command(point: Point, seeds: str, out: Path, policies: list[str] | None = None) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from slorouter.cli import main; sys.exit(main())",
        "bench",
        "--workload",
        point.workload,
        "--pool",
        point.pool,
        "--qps",
        f"{point.qps:g}",
        "--duration",
        str(point.duration),
        "--warmup",
        str(point.warmup),
        "--seeds",
        seeds,
        "--policies",
        ",".join(policies or POLICIES),
        "--no-progress",
        "--out",
        str(out / point.name),
    ]


def load(out: Path) -> list[tuple[Point, dict[str, dict[str, Any]]]]:
    """The points that have results under ``out``, in the order of POINTS, each with its runs by policy."""
    loaded = []
    for point in POINTS:
        path = out / point.name / "results.json"
        if path.exists():
            runs = json.loads(path.read_text())["runs"]
            loaded.append((point, {run["policy"]: run for run in runs}))
    return loaded


def seed_values(run: dict[str, Any], key: str) -> list[float]:
    per_seed = run.get("per_seed") or [run]
    return [s[key] for s in per_seed if s.get(key) is not None]


def fmt(value: float) -> str:
    if math.isinf(value):
        return "∞"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def label(point: Point) -> str:
    mixed = " (mixed pool)" if point.name in MIXED else ""
    return f"{point.workload}{mixed}, {point.pool}, {point.qps:g} QPS"


def table(out: Path) -> str:
    extra = " | best | predicted-latency / best | predicted-latency per seed |"
    lines = [
        "| workload, pool, load | " + " | ".join(POLICIES) + extra,
        "|---|" + "---:|" * len(POLICIES) + "---|---:|---|",
    ]
    for point, runs in load(out):
        p90 = {name: runs[name]["ttft_p90_ms"] for name in POLICIES if name in runs}
        best = min(p90, key=lambda name: p90[name])
        cells = [("**" + fmt(p90[n]) + "**") if n == best else fmt(p90[n]) for n in POLICIES if n in p90]
        ratio = p90["predicted-latency"] / p90[best] if "predicted-latency" in p90 else math.nan
        spread = seed_values(runs.get("predicted-latency", {}), "ttft_p90_ms")
        spread_cell = " / ".join(fmt(v) for v in spread)
        tail = f" | {best} | {ratio:.2f}× | {spread_cell} |"
        lines.append(f"| {label(point)} | " + " | ".join(cells) + tail)
    return "\n".join(lines)


def regret(out: Path) -> str:
    """Per point and policy: reuse achieved and avoidable prefill tok/s, the pool's view / the router's."""
    lines = [
        "| workload, pool, load | policy | reuse achieved (pool / router) | avoidable prefill tok/s "
        "(pool / router) | TTFT regret ms (router) | TTFT p90 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]

    def cell(value: Any, spec: str) -> str:
        return "–" if value is None else format(value, spec)

    for point, runs in load(out):
        for name in POLICIES:
            run = runs.get(name)
            if run is None or "pool_reuse_achieved" not in run:
                continue
            reuse = f"{cell(run['pool_reuse_achieved'], '.3f')} / {cell(run['reuse_achieved'], '.3f')}"
            indexed = run["reuse_achieved"] is not None
            router_avoidable = cell(run["avoidable_prefill_tok_s"] if indexed else None, ",.0f")
            avoidable = f"{cell(run['pool_avoidable_prefill_tok_s'], ',.0f')} / {router_avoidable}"
            ttft = cell(run.get("ttft_regret_ms_mean"), ".1f")
            lines.append(
                f"| {label(point)} | {name} | {reuse} | {avoidable} | {ttft} | {fmt(run['ttft_p90_ms'])} |"
            )
    return "\n".join(lines)


def accuracy(out: Path) -> str:
    """predicted-latency's MAPE (point prediction) and served-p90 coverage per point (seed medians)."""
    lines = [
        "| workload, pool, load | TTFT MAPE | TTFT p90 coverage | TPOT MAPE | TPOT p90 coverage |",
        "|---|---:|---:|---:|---:|",
    ]

    def cell(value: float | None) -> str:
        return "–" if value is None or math.isnan(value) else f"{value:.2f}"

    for point, runs in load(out):
        run = runs.get("predicted-latency")
        if run is None:
            continue
        keys = ("ttft_mape", "ttft_p90_coverage", "tpot_mape", "tpot_p90_coverage")
        lines.append(f"| {label(point)} | " + " | ".join(cell(run.get(k)) for k in keys) + " |")
    return "\n".join(lines)


def plot(out: Path, image: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = load(out)
    if not loaded:
        sys.exit(f"no results under {out}")
    rows = []
    for point, runs in loaded:
        p90 = {name: runs[name]["ttft_p90_ms"] for name in POLICIES if name in runs}
        best = min(p90.values())
        rows.append((point, {name: value / best for name, value in p90.items()}))

    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.8))
    height = 0.8 / len(POLICIES)
    colours = plt.get_cmap("tab10")
    for k, name in enumerate(POLICIES):
        ys = [i + (k - (len(POLICIES) - 1) / 2) * height for i in range(len(rows))]
        xs = [ratios.get(name, math.nan) for _, ratios in rows]
        ax.barh(ys, [min(x, 4.0) for x in xs], height=height, color=colours(k), label=name)
        for y, x in zip(ys, xs, strict=True):
            if x > 4.0:
                ax.text(4.02, y, f"{x:.0f}×", va="center", fontsize=6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(
        [label(point).replace(", ", "\n", 1).replace(" + ", " +\n") for point, _ in rows], fontsize=7
    )
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(0.9, 4.4)
    ax.set_xscale("log")
    ax.set_xticks([1, 1.25, 1.5, 2, 3, 4])
    ax.set_xticklabels(["1× (best)", "1.25×", "1.5×", "2×", "3×", "≥ 4×"])
    ax.set_xlabel("TTFT p90 relative to the best policy at that point (lower is better; median of the seeds)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=7, ncol=len(POLICIES), frameon=False)
    ax.set_title(
        "Every built-in policy on every workload, virtual time (slorouter bench)", fontsize=10, pad=22
    )
    fig.tight_layout()
    image.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(image, dpi=110)
    print(f"wrote {image}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run the points with slorouter bench")
    run_p.add_argument("out", type=Path)
    run_p.add_argument("--seeds", default="0,1,2")
    run_p.add_argument("--points", default="", help="comma-separated point names (default: all)")
    run_p.add_argument(
        "--policies", default="", help="comma-separated policies (default: every built-in policy)"
    )
    table_p = sub.add_parser("table", help="print the Markdown table")
    table_p.add_argument("out", type=Path)
    plot_p = sub.add_parser("plot", help="draw the plot")
    plot_p.add_argument("out", type=Path)
    plot_p.add_argument("image", type=Path)
    accuracy_p = sub.add_parser("accuracy", help="print predicted-latency's prediction quality")
    accuracy_p.add_argument("out", type=Path)
    regret_p = sub.add_parser("regret", help="print each policy's routing regret")
    regret_p.add_argument("out", type=Path)
    args = parser.parse_args()

    if args.command == "run":
        wanted = set(filter(None, args.points.split(",")))
        for point in POINTS:
            if wanted and point.name not in wanted:
                continue
            policies = [p for p in args.policies.split(",") if p] or None
            command = bench_command(point, args.seeds, args.out, policies)
            print("slorouter " + " ".join(shlex.quote(a) for a in command[3:]), flush=True)
            subprocess.run(command, check=True)
    elif args.command == "table":
        print(table(args.out))
    elif args.command == "accuracy":
        print(accuracy(args.out))
    elif args.command == "regret":
        print(regret(args.out))
    else:
        plot(args.out, args.image)


if __name__ == "__main__":
    main()
