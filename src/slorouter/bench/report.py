"""Writing a benchmark's results: ``results.json``, ``results.md`` and PNG plots."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slorouter.bench.runner import RunOutput

TABLE_COLUMNS: list[tuple[str, str]] = [
    ("policy", "policy"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p90_ms", "TTFT p90 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("tpot_p50_ms", "TPOT p50 ms"),
    ("tpot_p90_ms", "TPOT p90 ms"),
    ("tpot_p99_ms", "TPOT p99 ms"),
    ("e2e_p50_ms", "E2E p50 ms"),
    ("e2e_p95_ms", "E2E p95 ms"),
    ("output_tok_s", "output tok/s"),
    ("slo_attainment", "SLO att."),
    ("goodput_rps", "goodput rps"),
    ("shed", "shed"),
    ("unfinished", "unfinished"),
    ("prefix_cache_hit_rate", "prefix hit"),
    ("ttft_mape", "TTFT MAPE"),
    ("ttft_p90_coverage", "TTFT p90 cov."),
    ("e2e_mape", "E2E MAPE"),
]
SLO_COLUMNS = frozenset({"slo_attainment", "goodput_rps"})


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"
    return str(value)


def markdown_tables(runs: Sequence[dict[str, Any]], baseline: str | None = "heuristic-tuned") -> str:
    """One table per (workload, QPS), policies as rows, plus ratios to ``baseline`` when it ran."""
    lines: list[str] = []
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["workload"], run["qps"]), []).append(run)
    for (workload, qps), group in groups.items():
        first = group[0]
        seeds = first.get("seeds")
        seed_text = f"median of seeds {', '.join(map(str, seeds))}" if seeds else f"seed {first['seed']}"
        pickers = first.get("pickers")
        picker_text = f", {pickers:g} pickers" if pickers else ""
        shared = [
            what
            for key, what in (("shared_inflight", "in-flight counts"), ("shared_predictor", "predictor"))
            if pickers and first.get(key)
        ]
        if shared:
            picker_text += " sharing " + " and ".join(shared)
        lines.append(
            f"### {workload} at {qps:g} QPS — pool {first['pool']}{picker_text}, {first['duration_s']:g} s "
            f"(first {first['warmup_s']:g} s not measured), {seed_text}, "
            f"{first['requests']:g} measured requests"
        )
        lines.append("")
        columns = _columns(group)
        lines.append("| " + " | ".join(title for _, title in columns) + " |")
        lines.append("|" + "|".join("---" if key == "policy" else "---:" for key, _ in columns) + "|")
        for run in group:
            lines.append("| " + " | ".join(_cell(run.get(key)) for key, _ in columns) + " |")
        base = next((r for r in group if r["policy"] == baseline), None)
        others = [r for r in group if r is not base]
        if base is not None and others:
            lines.append("")
            lines.append(f"Ratios to `{baseline}` (below 1 is better):")
            lines.append("")
            lines.append("| policy | TTFT p50 | TTFT p90 | E2E p50 | TPOT p90 |")
            lines.append("|---|---:|---:|---:|---:|")
            for run in others:
                cells = [
                    _ratio(run.get(k), base.get(k)) for k in ("ttft_p50_ms", "ttft_p90_ms", "e2e_p50_ms")
                ]
                cells.append(_ratio(run.get("tpot_p90_ms"), base.get("tpot_p90_ms")))
                lines.append(f"| {run['policy']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _columns(group: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """The table's columns: without SLO attainment and goodput when no request carried an SLO (they would
    be blank and the finished rate)."""
    if any(run.get("slo_requests") for run in group):
        return TABLE_COLUMNS
    return [(key, title) for key, title in TABLE_COLUMNS if key not in SLO_COLUMNS]


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base == 0 or math.isinf(base) or math.isinf(value):
        return "–"
    return f"{value / base:.2f}×"


def write_results(
    outputs: Sequence[RunOutput], out_dir: Path, meta: dict[str, Any], *, plots: bool = True
) -> list[Path]:
    """Write results.json, results.md and, with ``plots``, the plots; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [o.summary for o in outputs]
    written = []
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n", encoding="utf-8")
    written.append(json_path)
    md_path = out_dir / "results.md"
    header = f"# slorouter bench\n\n`{meta.get('command', '')}`\n\n"
    md_path.write_text(header + markdown_tables(runs) + "\n", encoding="utf-8")
    written.append(md_path)
    if plots:
        written += write_plots(outputs, out_dir, meta.get("cdf_qps"))
    return written


def write_plots(outputs: Sequence[RunOutput], out_dir: Path, cdf_qps: float | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    by_workload: dict[str, list[RunOutput]] = {}
    for output in outputs:
        by_workload.setdefault(output.summary["workload"], []).append(output)
    for workload, group in by_workload.items():
        policies = list(dict.fromkeys(o.summary["policy"] for o in group))
        loads = sorted({o.summary["qps"] for o in group})
        if len(loads) > 1:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for policy in policies:
                points = sorted(
                    (o.summary["qps"], o.summary["ttft_p90_ms"])
                    for o in group
                    if o.summary["policy"] == policy and o.summary["ttft_p90_ms"] is not None
                )
                finite = [(q, v / 1000) for q, v in points if not math.isinf(v)]
                if finite:
                    ax.plot(*zip(*finite, strict=True), marker="o", label=policy)
            ax.set(xlabel="offered load (QPS)", ylabel="TTFT p90 (s)", title=f"{workload}: TTFT p90 vs load")
            _log_scale(ax.yaxis, ax.set_yscale)
            written.append(_finish(plt, fig, ax, out_dir / f"{workload}-ttft-p90-vs-qps.png"))
        load = cdf_qps if cdf_qps in loads else loads[len(loads) // 2]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for output in group:
            if output.summary["qps"] != load or not len(output.ttft_ms):
                continue
            ttft_s = np.sort(output.ttft_ms) / 1000
            shares = np.arange(1, len(ttft_s) + 1) / len(ttft_s)
            measured = np.isfinite(ttft_s)
            ax.plot(ttft_s[measured], shares[measured], label=output.summary["policy"])
        ax.set(xlabel="TTFT (s)", ylabel="share of requests", title=f"{workload}: TTFT CDF at {load:g} QPS")
        _log_scale(ax.xaxis, ax.set_xscale)
        written.append(_finish(plt, fig, ax, out_dir / f"{workload}-ttft-cdf-{load:g}qps.png"))
    return written


def _log_scale(axis: Any, set_scale: Any) -> None:
    """A log scale labelled at 1, 2 and 5 times the powers of ten only: matplotlib's default also labels
    minor ticks when the data spans less than a decade or so, and those labels overlap."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    set_scale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def _finish(plt: Any, fig: Any, ax: Any, path: Path) -> Path:
    """Grid, legend, save as PNG and close."""
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
