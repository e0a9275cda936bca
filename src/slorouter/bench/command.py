"""``slorouter bench``: compare routing policies on simulated pools in virtual time (see docs/bench.md)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from slorouter.bench.cluster import PICKER_ASSIGNMENTS, SHARED_INFLIGHT_PUBLISHING, ClusterSettings
from slorouter.bench.policies import (
    POLICY_NAMES,
    PolicyError,
    load_deadlines_file,
    load_flow_control_file,
    resolve_policies,
)
from slorouter.bench.pool import PoolSpecError, parse_pool
from slorouter.bench.runner import BenchPlan, RunOutput, median_over_seeds, run_plan
from slorouter.bench.workloads import workload_defaults, workload_names
from slorouter.bench.workloads.trace import Replay, replay
from slorouter.bench.workloads.trace_formats import FORMATS, read_trace
from slorouter.extras import has_module, install_hint
from slorouter.pool.kv_trust import TrustThresholds
from slorouter.scheduling.config_schema import SchedulerConfigError
from slorouter.sim.variants import VariantError, parse_variant

# --quick: maas-mix at one load point with every built-in policy, short enough for about a minute.
QUICK = {
    "workloads": ["maas-mix"],
    "pool": "8x qwen3-32b-h100-tp2",
    "qps": [60.0],
    "duration_s": 90.0,
    "warmup_s": 30.0,
}


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _fraction_below_one(text: str) -> float:
    value = _non_negative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be below 1 (a share of the batches), got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _qps_list(text: str) -> list[float]:
    return [_positive_float(part) for part in text.split(",") if part.strip()]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one seed")
    return values


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="compare routing policies on a simulated pool (discrete-event, virtual time)",
        description=(
            "Run workloads against a simulated vLLM pool in virtual time, once per policy with the same "
            "arrivals, and write results.json, results.md and plots. With --trace, the workload is a "
            "recorded trace (slorouter serve --record, Mooncake JSONL, Azure LLM CSV) replayed at its own "
            "times: it replaces --workload, --workload-param and --qps (giving them too is an error), and "
            "--duration defaults to the trace's span divided by --speed (a shorter one replays its start)."
        ),
    )
    parser.add_argument("--workload", type=_names, default=None, help="workload name(s), comma-separated")
    parser.add_argument(
        "--workload-param",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a workload parameter (repeatable; see docs/workloads.md)",
    )
    parser.add_argument("--pool", default=None, help="e.g. '16' or '8x llama3-8b-h100 + 8x llama3-8b-a100'")
    parser.add_argument(
        "--engine-variant",
        default="",
        metavar="SPEC",
        help="engine variant of every pod, e.g. 'decode-priority' or 'slow-prefill,kv-memory=0.2' "
        "(docs/simulator.md); a pool term's own '@SPEC' applies on top",
    )
    parser.add_argument("--qps", type=_qps_list, default=None, help="offered loads, comma-separated")
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="replay this trace instead of --workload/--qps (docs/replay.md)",
    )
    parser.add_argument(
        "--trace-format",
        choices=["auto", *FORMATS],
        default="auto",
        help="the trace's format (default: detected from its first line)",
    )
    parser.add_argument(
        "--trace-block-tokens",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tokens per hash of the trace (default: Mooncake 512, a recording's header)",
    )
    parser.add_argument(
        "--speed",
        type=_positive_float,
        default=None,
        help="with --trace: divide the trace's times by this (2 = twice the rate; default 1)",
    )
    parser.add_argument(
        "--duration",
        type=_positive_float,
        default=None,
        help="seconds of arrivals (with --trace: default the trace's span / --speed)",
    )
    parser.add_argument(
        "--warmup", type=_non_negative_float, default=None, help="first seconds not measured (default 20%%)"
    )
    parser.add_argument(
        "--policies",
        type=_names,
        default=list(POLICY_NAMES),
        help=f"built-in names ({', '.join(POLICY_NAMES)}) or NAME=CONFIG.yaml; default all built-ins",
    )
    parser.add_argument(
        "--flow-control",
        action="store_true",
        help="run every policy twice, without and with flow control (as POLICY+fc), side by side",
    )
    parser.add_argument(
        "--flow-control-config",
        type=Path,
        default=None,
        metavar="FILE.yaml",
        help="the flowControl section the POLICY+fc policies use (default: its defaults, enabled)",
    )
    parser.add_argument(
        "--deadlines-config",
        type=Path,
        default=None,
        metavar="FILE.yaml",
        help="the objectives (critical, standard, sheddable) and hedging sections of the POLICY+slo policies "
        "(default: hedge critical and standard, cancel sheddable)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds",
        type=_int_list,
        default=None,
        help="several seeds, comma-separated: every figure becomes the median over them (overrides --seed)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    parser.add_argument("--quick", action="store_true", help="a representative subset in about a minute")
    parser.add_argument("--scrape-interval-ms", type=_positive_float, default=50.0)
    parser.add_argument("--network-ms", type=_non_negative_float, default=0.5, help="one way, router ↔ pod")
    parser.add_argument(
        "--kv-event-delay-ms",
        type=_non_negative_float,
        default=5.0,
        help="engine step end → its KV events in the router's index, for precise-prefix policies",
    )
    parser.add_argument(
        "--kv-event-drop",
        type=_fraction_below_one,
        default=0.0,
        help="for precise-prefix policies: the share of KV-event batches lost for good (0..1, below 1); each "
        "gap clears the pod's blocks",
    )
    parser.add_argument(
        "--no-kv-trust",
        dest="kv_trust",
        action="store_false",
        help="use a pod's KV-event index at once after a clear, instead of the approximate estimate until "
        "it is rebuilt",
    )
    parser.add_argument(
        "--drain", type=_non_negative_float, default=300.0, help="seconds after the last arrival"
    )
    parser.add_argument(
        "--pickers",
        type=_positive_int,
        default=1,
        help="independent picker replicas over the same pods, each request routed by one of them",
    )
    parser.add_argument(
        "--picker-assignment",
        choices=PICKER_ASSIGNMENTS,
        default="random",
        help="how requests are spread over the pickers (default: a seeded random draw per request)",
    )
    parser.add_argument(
        "--shared-inflight",
        action="store_true",
        help="pickers publish their in-flight counts to each other (slorouter.pool.shared_inflight)",
    )
    parser.add_argument(
        "--shared-predictor",
        action="store_true",
        help="pickers use one latency predictor trained on all their samples (shared sidecars)",
    )
    parser.add_argument(
        "--shared-inflight-publishing",
        choices=SHARED_INFLIGHT_PUBLISHING,
        default="on-change",
        help="publish right after each change plus a heartbeat every interval, or every interval only",
    )
    parser.add_argument(
        "--shared-inflight-interval-ms",
        type=_positive_float,
        default=50.0,
        help="heartbeat interval (on-change) or publication interval (periodic)",
    )
    parser.add_argument(
        "--shared-inflight-delay-ms",
        type=_non_negative_float,
        default=2.0,
        help="a publication reaches the other pickers this much later",
    )
    parser.add_argument(
        "--shared-inflight-ttl-ms",
        type=_positive_float,
        default=500.0,
        help="a picker's published counts are dropped when not refreshed for this long",
    )
    parser.add_argument("--cdf-qps", type=_positive_float, default=None, help="load of the TTFT CDF plot")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def build_plan(args: argparse.Namespace) -> BenchPlan:
    """The plan from parsed arguments; ValueError (naming the flag) on bad input."""
    if args.trace is not None:
        given = [
            flag
            for flag, value in (
                ("--workload", args.workload),
                ("--workload-param", args.workload_param),
                ("--qps", args.qps),
                ("--quick", args.quick),
            )
            if value
        ]
        if given:
            raise ValueError(f"--trace replaces {', '.join(given)}: give one or the other")
    elif args.speed is not None:
        raise ValueError("--speed needs --trace")
    quick: dict[str, Any] = QUICK if args.quick else {}
    try:
        variant = parse_variant(args.engine_variant)
    except VariantError as exc:
        raise ValueError(f"--engine-variant: {exc}") from None
    try:
        profiles = parse_pool(args.pool or quick.get("pool") or "16", variant)
    except PoolSpecError as exc:
        raise ValueError(f"--pool: {exc}") from None
    replayed: Replay | None = None
    workloads: list[str]
    qps: list[float]
    if args.trace is not None:
        try:
            trace = read_trace(args.trace, args.trace_format, args.trace_block_tokens)
            replayed = replay(
                trace,
                speed=args.speed or 1.0,
                duration_s=args.duration,
                max_model_len=min(p.max_model_len for p in profiles),
            )
        except ValueError as exc:
            raise ValueError(f"--trace {exc}") from None
        workloads = [replayed.requests.name]
        qps = [replayed.qps]
        duration = replayed.duration_s
    else:
        workloads = args.workload or quick.get("workloads") or ["maas-mix"]
        qps = args.qps or quick.get("qps") or []
        if not qps:
            raise ValueError("--qps is required (e.g. --qps 5,10,15), or use --quick or --trace")
        duration = args.duration or quick.get("duration_s") or 300.0
    warmup = args.warmup if args.warmup is not None else quick.get("warmup_s", 0.2 * duration)
    if warmup >= duration:
        raise ValueError(f"--warmup ({warmup:g} s) must be shorter than --duration ({duration:g} s)")
    try:
        flow = None if args.flow_control_config is None else load_flow_control_file(args.flow_control_config)
    except PolicyError as exc:
        raise ValueError(f"--flow-control-config: {exc}") from None
    try:
        deadlines = None if args.deadlines_config is None else load_deadlines_file(args.deadlines_config)
    except PolicyError as exc:
        raise ValueError(f"--deadlines-config: {exc}") from None
    try:
        policies = resolve_policies(
            args.policies, with_flow_control=args.flow_control, flow_control=flow, deadlines=deadlines
        )
    except (PolicyError, SchedulerConfigError) as exc:
        raise ValueError(f"--policies: {exc}") from None
    for flag, on in (
        ("--shared-inflight", args.shared_inflight),
        ("--shared-predictor", args.shared_predictor),
    ):
        if on and args.pickers == 1:
            raise ValueError(f"{flag} needs --pickers 2 or more")
    try:
        settings = ClusterSettings(
            scrape_interval_s=args.scrape_interval_ms / 1000,
            network_s=args.network_ms / 1000,
            drain_s=args.drain,
            kv_event_delay_s=args.kv_event_delay_ms / 1000,
            kv_event_drop=args.kv_event_drop,
            kv_trust=TrustThresholds() if args.kv_trust else None,
            pickers=args.pickers,
            picker_assignment=args.picker_assignment,
            shared_inflight=args.shared_inflight,
            shared_inflight_publishing=args.shared_inflight_publishing,
            shared_predictor=args.shared_predictor,
            shared_inflight_interval_s=args.shared_inflight_interval_ms / 1000,
            shared_inflight_delay_s=args.shared_inflight_delay_ms / 1000,
            shared_inflight_ttl_s=args.shared_inflight_ttl_ms / 1000,
        )
    except ValueError as exc:
        raise ValueError(f"--shared-inflight-*: {exc}") from None
    known = workload_names()
    for name in [] if replayed is not None else workloads:
        if name not in known:
            raise ValueError(f"--workload: unknown workload {name!r} (known: {', '.join(known)})")
    params = dict(args.workload_param)
    for key in params:
        if not any(key in workload_defaults(name) for name in workloads):
            raise ValueError(
                f"--workload-param: no workload of {', '.join(workloads)} has a parameter {key!r}"
            )
    return BenchPlan(
        workloads=workloads,
        qps=qps,
        policies=policies,
        profiles=profiles,
        duration_s=duration,
        warmup_s=warmup,
        seed=args.seed,
        workload_params=params,
        settings=settings,
        replay=replayed,
    )


def run(args: argparse.Namespace) -> int:
    try:
        plan = build_plan(args)
    except ValueError as exc:
        print(f"slorouter bench: error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    show = not args.no_progress and sys.stderr.isatty()
    seeds = args.seeds or [plan.seed]
    outputs: list[RunOutput] = []
    try:
        for seed in seeds:
            outputs += _run_with_progress(dataclasses.replace(plan, seed=seed), show=show)
    except ValueError as exc:  # e.g. a workload parameter with a bad value
        print(f"slorouter bench: error: {exc}", file=sys.stderr)
        return 2
    if len(seeds) > 1:
        outputs = median_over_seeds(outputs)
    from slorouter.bench.report import markdown_tables, write_results

    meta = {
        "command": shlex.join(["slorouter", *sys.argv[1:]]) if sys.argv[0].endswith("slorouter") else "",
        "wall_s": round(time.perf_counter() - started, 1),
        "cdf_qps": args.cdf_qps,
    }
    plots = has_module("matplotlib")
    written = write_results(outputs, args.out, meta, plots=plots)
    print(markdown_tables([o.summary for o in outputs]))
    print(f"wrote {', '.join(str(p) for p in written)} in {meta['wall_s']} s")
    if not plots:
        print(f"plots skipped: they need matplotlib ({install_hint('bench')})")
    return 0


def _run_with_progress(plan: BenchPlan, *, show: bool) -> list[RunOutput]:
    if not show:
        return run_plan(plan)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} virtual s"),
        TimeElapsedColumn(),
        transient=False,
    ) as bar:
        tasks: dict[str, Any] = {}

        def progress(label: str, now: float, total: float) -> None:
            task = tasks.get(label)
            if task is None:
                task = tasks[label] = bar.add_task(label, total=total)
            bar.update(task, completed=min(now, total))

        return run_plan(plan, progress)
