"""Flow control in real time: one overload burst through the gateway and through Envoy + `slorouter epp`,
each with and without flow control, on simulated pods.

Four runs per seed, in this order: `slorouter serve` (the HTTP gateway) without and with flow control, then
Envoy + `slorouter epp --envoy` (the ext_proc picker, Envoy started by the picker with the bootstrap it
generates) without and with it. Each run starts a fresh pool (`slorouter sim`, ``--pods`` pods of
``--profile`` in one process, seeded by the seed: identical pods, cold caches) and a fresh router from the
same config: the built-in default scheduler (or ``--policy``, one of ``slorouter bench``'s policies,
slorouter.bench.policies), the objectives ``critical`` (priority 1), ``standard`` (0) and ``sheddable``
(-1), and for the flow-control runs ``flowControl: {enabled: true}`` (its defaults, or the section in
``--flow-control-config``), nothing else.

Workload (deterministic from the seed; the same for the four runs of a seed): streamed chat completions
(``stream_options.include_usage``) built by bench_quality_realtime.build_requests, half short chat (one of 4
shared system prompts plus a unique question, 500-1,500 prompt tokens), half long-context (one of 8 shared
documents plus a unique part, 3,000-8,000 tokens), max_tokens uniform in 100..300. Arrivals are Poisson in
three phases: ``--base-seconds`` at ``--base-load`` times the pool's capacity, ``--burst-seconds`` at
``--burst-factor`` times it, then ``--after-seconds`` at the base load again (long enough for the burst's
backlog to drain). Each request is ``critical`` / ``standard`` / ``sheddable`` with probability 20 / 50 /
30 % (header ``x-gateway-inference-objective``) and carries ``x-slo-ttft-ms: --slo-ttft`` (default
1,000 ms; the engine's unloaded TTFT on this workload, printed at the start, is 41 ms p50 and 188 ms
p99). The load generator (asyncio + aiohttp, benchmarks/_loadgen.py) runs in its own process.

Capacity is derived as bench_quality_realtime derives it (pod_capacity: one pod's engine driven far above
its capacity in virtual time, completions per second in that overload), not guessed: about 7.9 req/s per
`llama3-8b-h100` pod on this workload, so with 2 pods the burst offers about 32 req/s and the pool streams
at most about 3,200 tokens/s, which the 2-core development machine drives without CPU contention
distorting the latencies (bench_quality_realtime: about 60 streamed requests/s in total).

Per request: class, HTTP status, TTFT at the client (the first SSE chunk carrying a token), E2E, the
``x-slorouter-queued-ms`` header (time held by flow control) and the completion tokens. Reported per
front-end, flow control off/on and class, over the whole run and over the requests that arrived in the
burst: TTFT p50/p90/p99 (nearest rank; a request that got no first token counts as infinitely slow, ∞),
queue time p50/p99 (of the responses carrying the header: the 200s and flow control's own 429s and
503s), the counts of 200, 429 and 503 answers and of
errors (any other status, a transport error, a stream cut short: the script exits 1 if there is any), and
goodput (requests per second, over the phase's arrival span, answered 200 within their TTFT SLO). After
each run, once the load has drained and before the router stops, its /metrics (the gateway's port or the
picker's metrics port) must show ``slorouter_inflight_requests`` and ``slorouter_flow_control_queue_size``
back to 0 (the script exits 1 otherwise). With ``--seeds 0,1,2`` each figure is the median over the seeds,
each seed's value in brackets.

Every subprocess runs the code this script is beside: ``ROOT/src`` is put first on their PYTHONPATH.

    .venv/bin/python benchmarks/bench_flow_control_realtime.py [--seeds 0,1,2] [--pods 2]
        [--profile llama3-8b-h100] [--engine-variant SPEC] [--base-load 0.5] [--burst-factor 2.0]
        [--base-seconds 20] [--burst-seconds 20] [--after-seconds 40] [--slo-ttft 1000] [--policy NAME]
        [--front-ends gateway,epp] [--flow-control off,on] [--flow-control-config FILE.yaml] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from _harness import (
    ENVOY_ROUTINE,
    PROBLEM,
    ROOT,
    SLOROUTER,
    envoy_pid,
    free_port,
    free_port_range,
    gateway_config,
    logged_process,
    markdown_table,
    router_command,
    scrape,
)
from _loadgen import (
    CpuMeter,
    OpenLoop,
    StreamResult,
    loadgen_argv,
    record_row,
    run_as_loadgen,
    stream_completion,
)
from bench_quality_realtime import (
    ANSWER_FIELDS,
    MODEL,
    Request,
    Result,
    Workload,
    build_requests,
    pod_capacity,
)

WORKLOAD = Workload(long_share=0.5, chat_tokens=(500, 1500), long_tokens=(3000, 8000), max_tokens=(100, 300))
# Name, priority (objectives), share of the requests.
CLASSES = (("critical", 1, 0.2), ("standard", 0, 0.5), ("sheddable", -1, 0.3))
PHASES = ("base", "burst", "after")
CAPACITY_SEED = 0  # the capacity is the workload's: --seeds changes the arrivals, not the offered rates
OBJECTIVE_HEADER = "x-gateway-inference-objective"
GAUGES = ("slorouter_inflight_requests", "slorouter_flow_control_queue_size")
FRONT_ENDS = ("gateway", "epp")


# --- workload ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    offset_s: float  # seconds after the run's start
    phase: str
    cls: str
    request: Request


def build_schedule(spec: dict[str, Any]) -> list[Arrival]:
    """The run's arrivals: a Poisson sequence per phase at its rate, classes drawn from the seed."""
    workload = Workload(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["workload"].items()})
    seed = spec["seed"]
    arrivals: list[Arrival] = []
    start = 0.0
    classes = [name for name, _, _ in CLASSES]
    shares = [share for _, _, share in CLASSES]
    rng = np.random.default_rng([seed, 99])
    for k, phase in enumerate(PHASES):
        seconds, rate = spec["phases"][phase]
        if seconds > 0:
            for request in build_requests(seed * 1000 + k, rate, seconds, workload):
                cls = classes[int(rng.choice(len(classes), p=shares))]
                arrivals.append(Arrival(start + request.offset_s, phase, cls, request))
        start += seconds
    return arrivals


def unloaded_ttft_ms(profile: Any, workload: Workload, seed: int, count: int = 200) -> tuple[float, float]:
    """(p50, p99) of the engine's TTFT for this workload's requests, each alone on the pod (virtual time)."""
    from slorouter.sim.engine import Engine
    from slorouter.tokenizer import chat_to_prompt, encode_array

    engine = Engine(profile, seed=seed)
    ttfts = []
    for i, r in enumerate(build_requests(seed + 17, 1.0, float(count), workload)[:count]):
        now = i * 60.0  # far apart: each request finds the pod idle
        engine.add_request(i, encode_array(chat_to_prompt(json.loads(r.body)["messages"])), r.max_tokens, now)
        while True:
            step = engine.plan_step(now)
            if step is None:
                ready = engine.next_ready_time()
                if ready is None:
                    break
                now = ready
                continue
            ttfts += [event.ttft * 1e3 for event in engine.commit_step(step).finished]
            now = step.end
    return float(np.percentile(ttfts, 50)), float(np.percentile(ttfts, 99))


# --- load generator (its own process) ---------------------------------------------------------------------


@dataclass
class FcResult(Result):
    cls: str = ""
    offset_s: float = 0.0  # scheduled arrival, seconds after the run's start


async def run_load(spec: dict[str, Any]) -> dict[str, Any]:
    url = f"{spec['url']}/v1/chat/completions"
    schedule = build_schedule(spec)
    headers = {
        cls: {"Content-Type": "application/json", "x-slo-ttft-ms": f"{spec['slo_ttft_ms']:g}",
              OBJECTIVE_HEADER: cls}
        for cls, _, _ in CLASSES
    }  # fmt: skip
    results: list[FcResult] = []
    sender = OpenLoop()
    loop = sender.loop
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=spec["request_timeout_s"])
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        cpu = CpuMeter(spec["pids"])

        def begin(i: int, arrival: Arrival, sent: float, lag_ms: float) -> Coroutine[Any, Any, StreamResult]:
            r = arrival.request
            result = FcResult(arrival.phase, i, r.kind, r.prompt_tokens, r.max_tokens, lag_ms,
                              cls=arrival.cls, offset_s=arrival.offset_s)  # fmt: skip
            results.append(result)
            return stream_completion(session, url, r.body, headers[arrival.cls], sent, result.answer)

        start = loop.time() + 0.2
        for i, arrival in enumerate(schedule):
            await sender.send(start + arrival.offset_s, partial(begin, i, arrival))
        sending_done = loop.time()
        await sender.drain(spec["request_timeout_s"] + 5)
        drain_s = loop.time() - sending_done
        for task in sender.tasks:  # still running past the timeout: counted as errors
            task.cancel()
    wall = loop.time() - start
    cores = cpu.cores(wall)
    for result in results:  # a request still open past the timeout (its task cancelled) is an error
        answer = result.answer
        if answer.status in (0, 200) and math.isnan(answer.e2e_ms) and not answer.error:
            answer.error = "no complete answer within the load generator's timeout"
    info = {
        "wall_s": round(wall, 1),
        "drain_s": round(drain_s, 1),
        "cpu": {name: round(value, 2) for name, value in cores.items()},
        "lag_p99_ms": float(np.percentile([r.lag_ms for r in results], 99)) if results else 0.0,
    }
    return {"info": info, "results": [record_row(r, ANSWER_FIELDS) for r in results]}


# --- orchestration ----------------------------------------------------------------------------------------


def router_config(
    port: int, endpoints: list[str], policy: str | None, seed: int, fc: dict[str, Any] | None
) -> dict[str, Any]:
    """The config of both front-ends: the default scheduler (or ``policy``), the objectives, and ``fc`` as
    the ``flowControl`` section (None: disabled)."""
    if policy is None:
        config: dict[str, Any] = {
            "gateway": {"host": "127.0.0.1", "port": port},
            "pool": {"endpoints": endpoints},
            "seed": seed,
        }
    else:
        config = gateway_config(port, endpoints, policy, seed)
    config["objectives"] = {name: {"priority": priority} for name, priority, _ in CLASSES}
    config["flowControl"] = {"enabled": False} if fc is None else fc
    return config


def gauges(metrics_url: str, settle_s: float = 5.0) -> dict[str, Any]:
    """The in-flight and flow-control queue gauges (summed over their labels), polled until both are 0 or
    ``settle_s`` has passed."""
    started = time.monotonic()
    while True:
        try:
            totals = scrape(metrics_url)
        except (OSError, urllib.error.URLError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}", "zero": False}
        values = {name: totals.get(name) for name in GAUGES}
        zero = all(not value for value in values.values())
        waited = time.monotonic() - started
        if zero or waited >= settle_s:
            return {**values, "zero": zero, "waited_s": round(waited, 2)}
        time.sleep(0.25)


def run_one(front_end: str, fc: bool, seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    name = f"{front_end}-{'fc' if fc else 'nofc'}-seed{seed}"
    sim_port = free_port_range(args.pods)
    port = free_port()
    endpoints = [f"127.0.0.1:{sim_port + i}" for i in range(args.pods)]
    config_path = tmp / f"{name}.yaml"
    flow_control = args.flow_control_section if fc else None
    config_path.write_text(yaml.safe_dump(router_config(port, endpoints, args.policy, seed, flow_control)))
    sim = [*SLOROUTER, "sim", "--pods", str(args.pods), "--port", str(sim_port), "--profile", args.profile,
           "--model", MODEL, "--seed", str(seed), "--engine-variant", args.engine_variant]  # fmt: skip
    router, metrics_port, router_ports = router_command(config_path, port, envoy=front_end == "epp")
    spec = {
        "url": f"http://127.0.0.1:{port}",
        "seed": seed,
        "phases": {phase: [seconds, rate] for phase, (seconds, rate) in args.phases.items()},
        "workload": asdict(WORKLOAD),
        "slo_ttft_ms": args.slo_ttft,
        "request_timeout_s": args.request_timeout,
    }
    spec_path, out_path = tmp / f"{name}-spec.json", tmp / f"{name}-out.json"
    logs = {"sim": tmp / f"{name}-sim.log", "router": tmp / f"{name}-router.log"}
    with contextlib.ExitStack() as stack:
        pids = {"sim": stack.enter_context(logged_process(sim, [sim_port + i for i in range(args.pods)],
                                                          logs["sim"])).pid}  # fmt: skip
        pids["router"] = stack.enter_context(logged_process(router, router_ports, logs["router"])).pid
        if front_end == "epp":
            envoy = envoy_pid(pids["router"])
            if envoy is not None:
                pids["envoy"] = envoy
        spec["pids"] = pids
        spec_path.write_text(json.dumps(spec))
        loadgen = subprocess.run(loadgen_argv(__file__, spec_path, out_path))
        if loadgen.returncode != 0:
            raise SystemExit(f"{name}: the load generator failed ({loadgen.returncode})")
        after = gauges(f"http://127.0.0.1:{metrics_port}/metrics")
    output: dict[str, Any] = json.loads(out_path.read_text())
    output["info"]["gauges"] = after
    problems = {}
    for process_name, log in logs.items():
        lines = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if PROBLEM.search(line) and not ENVOY_ROUTINE.search(line)
        ]
        if lines:
            problems[process_name] = lines[-5:]
            print(f"{name} {process_name} log (last problems):\n" + "\n".join(lines[-5:]), file=sys.stderr)
    output["info"]["log_problems"] = problems
    return output


# --- report -----------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (infinite values allowed); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def outcome(r: dict[str, Any]) -> str:
    """``200`` (a whole stream with a token), ``429``, ``503`` or ``error``."""
    if r["status"] == 200:
        return "200" if not r["error"] and not math.isnan(r["ttft_ms"]) else "error"
    return str(r["status"]) if r["status"] in (429, 503) else "error"


def summarize(results: list[dict[str, Any]], seconds: float, slo_ms: float) -> dict[str, dict[str, Any]]:
    """Per class (and ``all``): TTFT and queue-time percentiles, outcome counts, goodput."""
    summary: dict[str, dict[str, Any]] = {}
    for cls in [name for name, _, _ in CLASSES] + ["all"]:
        rows = [r for r in results if cls in ("all", r["cls"])]
        outcomes = [outcome(r) for r in rows]
        ttft = [r["ttft_ms"] if o == "200" else math.inf for r, o in zip(rows, outcomes, strict=True)]
        queued = [r["queued_ms"] for r in rows if not math.isnan(r["queued_ms"])]
        good = sum(t <= slo_ms for t in ttft)
        s: dict[str, Any] = {"requests": len(rows)}
        for q in (50, 90, 99):
            s[f"ttft_p{q}"] = percentile(ttft, q)
        for q in (50, 99):
            s[f"queued_p{q}"] = percentile(queued, q)
        for key in ("200", "429", "503", "error"):
            s[key] = outcomes.count(key)
        s["goodput"] = good / seconds
        summary[cls] = s
    return summary


def fmt(value: float, digits: int = 0) -> str:
    if math.isnan(value):
        return "–"
    if math.isinf(value):
        return "∞"
    return f"{value:,.{digits}f}"


def median(values: list[float]) -> float:
    """The median of a seed's values; infinities count as the largest, NaNs (no value) are left out."""
    present = sorted(v for v in values if not math.isnan(v))
    if not present:
        return math.nan
    middle = len(present) // 2
    if len(present) % 2:
        return present[middle]
    low, high = present[middle - 1], present[middle]
    return high if math.isinf(high) else (low + high) / 2


def cell(values: list[float], digits: int = 0) -> str:
    text = fmt(median(values), digits)
    if len(values) > 1:
        text += " (" + " / ".join(fmt(v, digits) for v in values) + ")"
    return text


COLUMNS = (
    ("TTFT p50 ms", "ttft_p50", 0),
    ("TTFT p90 ms", "ttft_p90", 0),
    ("TTFT p99 ms", "ttft_p99", 0),
    ("queued p50 ms", "queued_p50", 0),
    ("queued p99 ms", "queued_p99", 0),
    ("200", "200", 0),
    ("429", "429", 0),
    ("503", "503", 0),
    ("errors", "error", 0),
    ("goodput req/s", "goodput", 1),
)


def table(summaries: dict[str, list[dict[str, Any]]], window: str) -> str:
    headers = ["front-end", "flow control", "class", *(title for title, _, _ in COLUMNS)]
    rows = []
    for config, per_seed in summaries.items():
        front_end, _, fc = config.partition(" ")
        for cls in [name for name, _, _ in CLASSES] + ["all"]:
            cells = [
                cell([float(s[window][cls][key]) for s in per_seed], digits) for _, key, digits in COLUMNS
            ]
            rows.append([front_end, fc, cls, *cells])
    return markdown_table(headers, rows)


def gauge_table(outputs: dict[str, list[dict[str, Any]]], seeds: list[int]) -> str:
    headers = ["front-end", "flow control", *(f"seed {seed}: in flight / queued" for seed in seeds)]
    rows = []
    for config, per_seed in outputs.items():
        front_end, _, fc = config.partition(" ")
        cells = []
        for output in per_seed:
            g = output["info"]["gauges"]
            if "error" in g:
                cells.append(f"**scrape failed: {g['error']}**")
                continue
            values = " / ".join("absent" if g[name] is None else f"{g[name]:g}" for name in GAUGES)
            cells.append(values + ("" if g["zero"] else f" **not 0 after {g['waited_s']} s**"))
        rows.append([front_end, fc, *cells])
    return markdown_table(headers, rows)


def main() -> None:
    if run_as_loadgen(run_load):
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; figures are medians over them")
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--profile", default="llama3-8b-h100", help="the pods' profile (slorouter sim)")
    parser.add_argument("--engine-variant", default="", metavar="SPEC", help="the pods' engine variant")
    parser.add_argument("--base-load", type=float, default=0.5, help="base load, a share of the capacity")
    parser.add_argument("--burst-factor", type=float, default=2.0, help="the burst's load, × the capacity")
    parser.add_argument("--base-seconds", type=float, default=20.0, help="base load before the burst")
    parser.add_argument("--burst-seconds", type=float, default=20.0)
    parser.add_argument("--after-seconds", type=float, default=40.0, help="base load after the burst")
    parser.add_argument("--slo-ttft", type=float, default=1000.0, help="x-slo-ttft-ms of every request")
    parser.add_argument("--policy", default=None, help="a slorouter bench policy (default: built-in default)")
    parser.add_argument("--front-ends", default="gateway,epp", help="gateway, epp or both")
    parser.add_argument("--flow-control", default="off,on", help="off, on or both")
    parser.add_argument(
        "--flow-control-config",
        type=Path,
        default=None,
        metavar="FILE.yaml",
        help="the flowControl section of the runs with flow control (default: its defaults, enabled)",
    )
    parser.add_argument("--request-timeout", type=float, default=180.0, help="seconds, per request")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args()
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: integers separated by commas, got {args.seeds!r}")
    front_ends = args.front_ends.split(",")
    if not front_ends or any(f not in FRONT_ENDS for f in front_ends):
        parser.error(f"--front-ends: gateway, epp or both, got {args.front_ends!r}")
    modes = args.flow_control.split(",")
    if not modes or any(m not in ("off", "on") for m in modes):
        parser.error(f"--flow-control: off, on or both, got {args.flow_control!r}")
    from slorouter.bench.policies import PolicyError, load_flow_control_file, resolve_policy
    from slorouter.bench.pool import parse_pool

    if args.policy is not None:
        try:
            resolve_policy(args.policy)
        except (PolicyError, ValueError) as exc:
            parser.error(f"--policy: {exc}")
    args.flow_control_section = {"enabled": True}
    if args.flow_control_config is not None:
        try:
            section = load_flow_control_file(args.flow_control_config)
        except PolicyError as exc:
            parser.error(f"--flow-control-config: {exc}")
        args.flow_control_section = section.model_dump(mode="json", by_alias=True, exclude_unset=True)

    try:
        profile = parse_pool(
            f"1x {args.profile}" + (f"@{args.engine_variant}" if args.engine_variant else "")
        )[0]
    except ValueError as exc:
        parser.error(f"--profile / --engine-variant: {exc}")
    # The subprocesses (pods, routers) run the code beside this script, whatever is installed.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    started = time.monotonic()
    capacity = args.pods * pod_capacity(profile, WORKLOAD, CAPACITY_SEED)
    base_rate, burst_rate = args.base_load * capacity, args.burst_factor * capacity
    args.phases = {
        "base": (args.base_seconds, base_rate),
        "burst": (args.burst_seconds, burst_rate),
        "after": (args.after_seconds, base_rate),
    }
    p50, p99 = unloaded_ttft_ms(profile, WORKLOAD, CAPACITY_SEED)
    print(f"capacity of {args.pods}x {profile.name}: {capacity:.1f} req/s (engines in virtual time, "
          f"overloaded); base {base_rate:.1f} req/s, burst {burst_rate:.1f} req/s; unloaded TTFT p50 "
          f"{p50:.0f} ms, p99 {p99:.0f} ms; SLO TTFT {args.slo_ttft:g} ms", flush=True)  # fmt: skip
    outputs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for front_end in front_ends:
                for mode in modes:
                    config = f"{front_end} {mode}"
                    output = run_one(front_end, mode == "on", seed, args, Path(tmp))
                    outputs.setdefault(config, []).append(output)
                    info = output["info"]
                    counts = summarize(output["results"], 1.0, args.slo_ttft)["all"]
                    print(f"seed {seed}, {config}: {counts['requests']} requests, 200 {counts['200']}, "
                          f"429 {counts['429']}, 503 {counts['503']}, errors {counts['error']}; "
                          f"drain {info['drain_s']} s, send lag p99 {info['lag_p99_ms']:.1f} ms, "
                          f"gauges {info['gauges']}, CPU cores {info['cpu']}", flush=True)  # fmt: skip
    burst_start = args.base_seconds
    whole_s = args.base_seconds + args.burst_seconds + args.after_seconds
    summaries: dict[str, list[dict[str, Any]]] = {}
    for config, per_seed in outputs.items():
        for output in per_seed:
            results = output["results"]
            burst = [r for r in results if r["phase"] == "burst"]
            summaries.setdefault(config, []).append(
                {
                    "whole run": summarize(results, whole_s, args.slo_ttft),
                    "burst": summarize(burst, args.burst_seconds, args.slo_ttft),
                }
            )
    if args.json:
        written = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"}
        args.json.write_text(
            json.dumps({"args": written, "capacity": capacity, "summaries": summaries, "outputs": outputs})
        )
    seeds_text = " / ".join(str(seed) for seed in seeds)
    print(f"\n**Whole run** ({whole_s:g} s of arrivals; medians of seeds {seeds_text}):\n")
    print(table(summaries, "whole run"))
    print(f"\n**Burst window** (the requests that arrived in the {args.burst_seconds:g} s burst, from "
          f"{burst_start:g} s):\n")  # fmt: skip
    print(table(summaries, "burst"))
    print("\nGauges after each run, once the load drained (slorouter_inflight_requests / "
          "slorouter_flow_control_queue_size):\n")  # fmt: skip
    print(gauge_table(outputs, seeds))
    cpu_rows = []
    for config, per_seed in outputs.items():
        names = sorted({name for output in per_seed for name in output["info"]["cpu"]})
        cpu_rows.append(
            [config, ", ".join(f"{n} {statistics.median(o['info']['cpu'].get(n, 0.0) for o in per_seed):.2f}"
                               for n in names)]
        )  # fmt: skip
    print("\nCPU, cores over each run (median of the seeds):\n")
    print(markdown_table(["run", "CPU cores"], cpu_rows))
    print(
        f"\n{args.pods}x `{profile.name}`, capacity {capacity:.1f} req/s (derived); base "
        f"{base_rate:.1f} req/s for {args.base_seconds:g} s, burst {burst_rate:.1f} req/s for "
        f"{args.burst_seconds:g} s, base for {args.after_seconds:g} s; classes critical / standard / "
        f"sheddable 20 / 50 / 30 %; SLO TTFT {args.slo_ttft:g} ms; scheduler "
        f"{args.policy or 'built-in default'}."
    )
    print(f"wall time {time.monotonic() - started:.0f} s; command: .venv/bin/python {shlex.join(sys.argv)}")
    errors = sum(s["whole run"]["all"]["error"] for per_seed in summaries.values() for s in per_seed)
    not_zero = [
        f"{config} (seed {seed})"
        for config, per_seed in outputs.items()
        for seed, o in zip(seeds, per_seed, strict=True)
        if not o["info"]["gauges"].get("zero")
    ]
    if errors or not_zero:
        print(f"\n**FAILED**: {errors} errors (statuses other than 200/429/503, transport errors, streams "
              f"cut short); gauges not back to 0 after: {', '.join(not_zero) or 'none'}",
              file=sys.stderr)  # fmt: skip
        sys.exit(1)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
