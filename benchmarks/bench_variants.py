"""The routing policies on engines they were not tuned on: one table per engine variant.

Every variant is a pool of simulated pods (``slorouter bench``'s pool spec with engine variants, see
docs/simulator.md); every policy runs on it through the same discrete-event runner ``slorouter bench`` uses
(``ClusterSimulator`` + ``summarize_run``), on the same arrivals, at two loads that are shares of the
variant's own capacity, for several seeds; each figure is the median over the seeds.

Capacity is derived per variant, not guessed: each distinct pod class of the pool is driven alone, in
virtual time, by the workload offered well above what it can serve (the rate doubles until completions
fall behind arrivals); its completions per second over the second half of that overload are its maximum
throughput, and the pool's capacity is their sum (what a load-aware router could at best get out of it).

    .venv/bin/python benchmarks/bench_variants.py [--variants all|NAME,...] [--policies P,...]
        [--seeds 0,1,2] [--loads 0.55,0.75] [--pods 8] [--duration 120] [--warmup 30]
        [--workload new-user] [--workload-param KEY=VALUE ...] [--json OUT] [--list]

``--variants`` takes names of VARIANTS below or ``NAME=POOLSPEC`` for any other pool, e.g.
``--variants "fat=8x llama3-8b-h100@w=0.7,batch-tokens=16384"``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from _harness import markdown_table
from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
from slorouter.bench.policies import load_deadlines_file, resolve_policies
from slorouter.bench.pool import describe_pool, parse_pool
from slorouter.bench.records import RunRecords
from slorouter.bench.results import summarize_run
from slorouter.bench.workloads import BenchRequest, generate
from slorouter.sim.engine import Engine
from slorouter.sim.profiles import Profile
from slorouter.tokenizer import encode_bytes

# name -> pool spec, with {n} the pod count (and {half} half of it, for the mixed pool).
VARIANTS: dict[str, str] = {
    "default": "{n}x llama3-8b-h100",
    "slow-prefill": "{n}x llama3-8b-h100@slow-prefill",
    "fast-prefill": "{n}x llama3-8b-h100@fast-prefill",
    "slow-decode": "{n}x llama3-8b-h100@slow-decode",
    "fast-decode": "{n}x llama3-8b-h100@fast-decode",
    "decode-priority": "{n}x llama3-8b-h100@decode-priority",
    "prefill-priority": "{n}x llama3-8b-h100@prefill-priority",
    "small-budget": "{n}x llama3-8b-h100@small-budget",
    "small-kv": "{n}x llama3-8b-h100@small-kv",
    "decode-priority-small-kv": "{n}x llama3-8b-h100@small-kv,decode-priority",
    "mixed-slow-gpu": "{half}x llama3-8b-h100 + {half}x llama3-8b-h100@slow-gpu",
    "late-metrics": "{n}x llama3-8b-h100@late-metrics",
    "coarse-metrics": "{n}x llama3-8b-h100@coarse-metrics",
}
POLICIES = "heuristic,heuristic-tuned,token-aware,predicted-latency"
SUBJECT = "predicted-latency"  # the policy the ratio rows compare with the others
COLUMNS = [  # (summary key, header)
    ("ttft_p90_ms", "TTFT p90 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("chat_ttft_p90_ms", "chat TTFT p90 ms"),
    ("tpot_p50_ms", "TPOT p50 ms"),
    ("tpot_p90_ms", "TPOT p90 ms"),
    ("e2e_p50_ms", "E2E p50 ms"),
]
CAPACITY_SEED = 0  # capacity is a property of the workload's distribution, not of one run's seed
SWEEP = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # loads probed for the knee, shares of the engines' bound
SWEEP_SECONDS = 60.0
KNEE_FACTOR = 2.0


# --- capacity ---------------------------------------------------------------------------------------------


def pod_capacity(profile: Profile, workload: str, params: dict[str, str], seconds: float = 60.0) -> float:
    """Requests/s one pod of ``profile`` completes when offered the workload far above that."""
    rate = 4.0
    while True:
        served = _overloaded_throughput(profile, workload, params, rate, seconds)
        if served < 0.8 * rate:
            return served
        rate *= 2


def _overloaded_throughput(
    profile: Profile, workload: str, params: dict[str, str], rate: float, seconds: float
) -> float:
    requests = generate(
        workload, qps=rate, duration_s=seconds, seed=CAPACITY_SEED, params=params,
        max_model_len=profile.max_model_len,
    )  # fmt: skip
    engine = Engine(profile, seed=CAPACITY_SEED, report_tokens=False)
    now, i, finished = 0.0, 0, 0
    while now < seconds:
        while i < len(requests) and requests[i].arrival <= now:
            engine.add_request(
                i, encode_bytes(requests[i].prompt), requests[i].max_tokens, requests[i].arrival
            )
            i += 1
        step = engine.plan_step(now)
        if step is None:
            ready = [t for t in (engine.next_ready_time(), _arrival(requests, i)) if t is not None]
            if not ready:
                break
            now = min(ready)
            continue
        finished += sum(
            seconds / 2 <= done.finish_time < seconds for done in engine.commit_step(step).finished
        )
        now = step.end
    return finished / (seconds / 2)


def _arrival(requests: list[BenchRequest], i: int) -> float | None:
    return requests[i].arrival if i < len(requests) else None


def engine_capacity(profiles: list[Profile], workload: str, params: dict[str, str]) -> float:
    """The pool's throughput bound: the sum of its pods' overloaded throughputs."""
    per_class: dict[Profile, float] = {}
    for profile in profiles:
        if profile not in per_class:
            per_class[profile] = pod_capacity(profile, workload, params)
    return sum(per_class[p] for p in profiles)


def load_aware_capacity(
    profiles: list[Profile], bound: float, args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[float, list[tuple[float, float | None]]]:
    """The highest load (a share of ``bound``, in SWEEP steps) at which the load-aware ``token-aware``
    policy keeps its TTFT p90 within KNEE_FACTOR × its TTFT p90 at the lightest load, times ``bound``.

    A pool serves less than the sum of its pods' overloaded throughputs: arrivals are bursty and a long
    prompt blocks its pod's queue, so the knee comes earlier. Each probe is one short run (SWEEP_SECONDS of
    arrivals, seed CAPACITY_SEED)."""
    policy = resolve_policies(["token-aware"])[0]
    params = dict(args.workload_param)
    probes: list[tuple[float, float | None]] = []
    reference = math.nan
    capacity_share = SWEEP[0]
    for share in SWEEP:
        requests = generate(
            args.workload, qps=share * bound, duration_s=SWEEP_SECONDS, seed=CAPACITY_SEED, params=params,
            max_model_len=min(p.max_model_len for p in profiles),
        )  # fmt: skip
        with ClusterSimulator(profiles, policy.config, use_predictor=False, seed=CAPACITY_SEED) as sim:
            rec = sim.run(requests)
        ttft = summarize_run(rec, warmup_s=SWEEP_SECONDS / 4, duration_s=SWEEP_SECONDS)["ttft_p90_ms"]
        probes.append((share, ttft))
        log(f"  capacity probe {share:.0%} of {bound:.1f} req/s: token-aware TTFT p90 {ttft} ms")
        if math.isnan(reference):
            reference = ttft
        elif ttft is None or ttft > KNEE_FACTOR * reference:
            break
        capacity_share = share
    return capacity_share * bound, probes


# --- runs -------------------------------------------------------------------------------------------------


def chat_ttft_p90_ms(rec: RunRecords, requests: list[BenchRequest], warmup: float, duration: float) -> float:
    """TTFT p90 of the measured chat turns (requests in a session), unfinished ones counting as ∞."""
    chat = np.array([r.session >= 0 for r in requests], dtype=bool)
    measured = chat & (rec.arrival >= warmup) & (rec.arrival < duration) & (rec.pod >= 0)
    ttft = np.where(np.isnan(rec.ttft_s[measured]), np.inf, rec.ttft_s[measured])
    if not len(ttft):
        return math.nan
    value = float(np.percentile(np.minimum(ttft, 1e300), 90))
    return math.inf if value > 1e290 else round(value * 1000, 3)


def run_variant(name: str, spec: str, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    profiles = parse_pool(spec)
    params = dict(args.workload_param)
    key = f"{describe_pool(profiles)} | {args.workload} {sorted(params.items())}"
    cache = (
        json.loads(args.capacity_cache.read_text())
        if args.capacity_cache and args.capacity_cache.exists()
        else {}
    )
    if key in cache:
        bound, capacity, probes = cache[key]
    else:
        bound = engine_capacity(profiles, args.workload, params)
        log(f"{name}: pool {describe_pool(profiles)}, engines' bound {bound:.1f} req/s")
        capacity, probes = load_aware_capacity(profiles, bound, args, log)
        if args.capacity_cache:
            cache[key] = (bound, capacity, probes)
            args.capacity_cache.write_text(json.dumps(cache, indent=1))
    log(f"{name}: load-aware capacity {capacity:.1f} req/s (engines' bound {bound:.1f})")
    policies = resolve_policies(args.policies, deadlines=args.deadlines)
    settings = ClusterSettings()
    max_model_len = min(p.max_model_len for p in profiles)
    runs: list[dict[str, Any]] = []
    for load in args.loads:
        qps = round(load * capacity, 2)
        for seed in args.seeds:
            requests = generate(
                args.workload, qps=qps, duration_s=args.duration, seed=seed, params=params,
                max_model_len=max_model_len,
            )  # fmt: skip
            for policy in policies:
                # The whole policy: its tuner, flow control, deadlines and engine priority too.
                with ClusterSimulator.of_policy(profiles, policy, settings=settings, seed=seed) as sim:
                    rec = sim.run(requests)
                labels = {"variant": name, "policy": policy.name, "load": load, "qps": qps, "seed": seed}
                summary = summarize_run(rec, warmup_s=args.warmup, duration_s=args.duration, labels=labels)
                summary["chat_ttft_p90_ms"] = chat_ttft_p90_ms(rec, requests, args.warmup, args.duration)
                runs.append(summary)
                if args.jsonl is not None:
                    with args.jsonl.open("a") as out:
                        meta = {"pool": describe_pool(profiles), "capacity_rps": capacity, "bound_rps": bound}
                        out.write(json.dumps({**meta, **summary}) + "\n")
                log(
                    f"  {name} load {load:g} ({qps:g} req/s) seed {seed} {policy.name}: TTFT p90 "
                    f"{summary['ttft_p90_ms']} ms, preemptions {summary['preemptions']}, "
                    f"{summary['sim_wall_s']:.0f} s"
                )
    return {
        "variant": name,
        "pool": describe_pool(profiles),
        "capacity_rps": capacity,
        "bound_rps": bound,
        "probes": probes,
        "runs": runs,
    }


def results_from_jsonl(paths: list[Path]) -> list[dict[str, Any]]:
    """Results rebuilt from ``--jsonl`` files (runs of several invocations, e.g. one seed each)."""
    results: dict[str, dict[str, Any]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            run = json.loads(line)
            result = results.setdefault(
                run["variant"],
                {"variant": run["variant"], "pool": run["pool"], "capacity_rps": run["capacity_rps"],
                 "bound_rps": run["bound_rps"], "runs": []},
            )  # fmt: skip
            result["runs"].append(run)
    return list(results.values())


def medians(result: dict[str, Any]) -> dict[tuple[float, str], dict[str, float]]:
    """(load, policy) -> the median over seeds of every reported figure (and preemptions, shed, qps)."""
    keys = [key for key, _ in COLUMNS] + ["preemptions", "qps", "unfinished"]
    groups: dict[tuple[float, str], list[dict[str, Any]]] = {}
    for run in result["runs"]:
        groups.setdefault((run["load"], run["policy"]), []).append(run)
    return {
        group: {key: float(np.median([math.inf if r[key] is None else r[key] for r in runs])) for key in keys}
        for group, runs in groups.items()
    }


# --- report -----------------------------------------------------------------------------------------------


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "∞"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _ratio(a: float, b: float) -> str:
    if math.isinf(a) and math.isinf(b):
        return "–"
    if b == 0 or math.isnan(a) or math.isnan(b):
        return "–"
    return "∞" if math.isinf(a) else f"{a / b:.2f}×"


def variant_table(result: dict[str, Any], policies: list[str], subject: str = SUBJECT) -> str:
    figures = medians(result)
    seeds = sorted({run["seed"] for run in result["runs"]})
    loads = sorted({load for load, _ in figures})
    rows: list[list[str]] = []
    for load in loads:
        qps = next(f["qps"] for (at, _), f in figures.items() if at == load)
        for policy in policies:
            f = figures.get((load, policy))
            if f is None:  # not run on this variant
                continue
            rows.append([f"{load:.0%} ({qps:g} req/s)", policy, *(_fmt(f[k]) for k, _ in COLUMNS),
                         f"{f['preemptions']:.0f}"])  # fmt: skip
        pred = figures.get((load, subject))
        for base in ("heuristic", "token-aware"):
            other = figures.get((load, base))
            if pred is not None and other is not None:
                ratios = [_ratio(pred[k], other[k]) for k, _ in COLUMNS]
                rows.append(["", f"{subject} / {base}", *ratios, ""])
    headers = ["load", "policy", *(h for _, h in COLUMNS), "preemptions"]
    title = (
        f"#### {result['variant']}: `{result['pool']}`, load-aware capacity {result['capacity_rps']:.1f} "
        f"req/s (engines' bound {result['bound_rps']:.1f}); median over seeds {','.join(map(str, seeds))}"
    )
    return f"{title}\n\n{markdown_table(headers, rows)}"


def summary_table(results: list[dict[str, Any]], subject: str = SUBJECT) -> str:
    """The subject policy against the best other policy, per variant and load: where it loses."""
    rows: list[list[str]] = []
    for result in results:
        figures = medians(result)
        for load in sorted({load for load, _ in figures}):
            pred = figures.get((load, subject))
            others = {p: f for (at, p), f in figures.items() if at == load and p != subject}
            if pred is None or not others:
                continue
            cells = []
            for key, _ in COLUMNS:
                best_policy, best = min(others.items(), key=lambda item: item[1][key])
                cells.append(f"{_ratio(pred[key], best[key])} ({best_policy})")
            rows.append([result["variant"], f"{load:.0%}", *cells])
    headers = ["variant", "load", *(f"{h}: {subject} / best other" for _, h in COLUMNS)]
    return markdown_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", default="all", help="'all', or names / NAME=POOLSPEC, comma-separated")
    parser.add_argument("--policies", default=POLICIES, help=f"comma-separated (default {POLICIES})")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--loads", default="0.55,0.75", help="shares of the derived capacity")
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    parser.add_argument("--warmup", type=float, default=30.0, help="first seconds not measured")
    parser.add_argument("--workload", default="new-user")
    parser.add_argument("--workload-param", action="append", default=[], metavar="KEY=VALUE", type=_key_value)
    parser.add_argument("--json", type=Path, default=None, help="write every result (runs, probes) here")
    parser.add_argument("--jsonl", type=Path, default=None, help="append each run's summary here as it ends")
    parser.add_argument(
        "--report", type=Path, nargs="+", default=None, metavar="JSONL", help="only print tables from these"
    )
    parser.add_argument(
        "--subject",
        default=SUBJECT,
        help=f"the policy compared with the others in the ratios (default {SUBJECT})",
    )
    parser.add_argument(
        "--capacity-cache",
        type=Path,
        default=None,
        help="reuse (and store) derived capacities in this JSON file",
    )
    parser.add_argument(
        "--deadlines-config",
        type=Path,
        default=None,
        metavar="FILE.yaml",
        help="the objectives and hedging sections of the POLICY+slo policies (slorouter bench's flag)",
    )
    parser.add_argument("--list", action="store_true", help="list the variants and exit")
    args = parser.parse_args()
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    # A policy's name: a built-in's own, NAME of NAME=PATH, or the file's stem.
    args.policy_names = [spec.partition("=")[0] if "=" in spec else Path(spec).stem for spec in args.policies]
    if args.report:
        report(results_from_jsonl(args.report), args)
        return
    if args.list:
        for name, spec in VARIANTS.items():
            print(f"{name}: {spec.format(n=args.pods, half=args.pods // 2)}")
        return
    if args.pods < 2 or args.pods % 2:
        parser.error("--pods must be an even number >= 2 (the mixed pool is half and half)")
    if not 0 <= args.warmup < args.duration:
        parser.error("--warmup must be >= 0 and shorter than --duration")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        args.loads = [float(s) for s in args.loads.split(",") if s.strip()]
    except ValueError as exc:
        parser.error(f"--seeds / --loads: {exc}")
    if not args.seeds or not args.loads or any(not load > 0 for load in args.loads):
        parser.error("--seeds and --loads need at least one value; loads must be > 0")
    selected: dict[str, str] = {}
    for item in VARIANTS if args.variants == "all" else args.variants.split(","):
        name, sep, spec = item.strip().partition("=")
        if sep:
            selected[name] = spec
        elif name in VARIANTS:
            selected[name] = VARIANTS[name]
        else:
            parser.error(
                f"--variants: unknown variant {name!r} (known: {', '.join(VARIANTS)}; or NAME=POOLSPEC)"
            )
    try:
        args.deadlines = None if args.deadlines_config is None else load_deadlines_file(args.deadlines_config)
        resolve_policies(args.policies, deadlines=args.deadlines)
        for name, spec in selected.items():
            selected[name] = spec.format(n=args.pods, half=args.pods // 2)
            parse_pool(selected[name])
    except ValueError as exc:
        parser.error(str(exc))

    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {line}", file=sys.stderr, flush=True)

    results = [run_variant(name, spec, args, log) for name, spec in selected.items()]
    if args.json:
        written = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}
        args.json.write_text(json.dumps(written))
    report(results, args)
    command = shlex.join(["benchmarks/bench_variants.py", *sys.argv[1:]])
    print(f"\nwall {time.monotonic() - started:.0f} s; command: .venv/bin/python {command}")


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    subject = args.subject
    print(f"### {subject} against the best other policy (ratio > 1: {subject} loses)\n")
    print(summary_table(results, subject))
    for result in results:
        print()
        print(variant_table(result, args.policy_names, subject))


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


if __name__ == "__main__":
    main()
