"""Routing quality in real time: the policies of ``slorouter bench`` through the gateway (or Envoy + the
picker), on simulated pods.

The pool is ``--pool`` (``slorouter bench``'s pool spec: ``8x llama3-8b-h100``, mixed classes joined by
``+``, engine variants as ``@VARIANT`` per term or ``--engine-variant`` for all; docs/simulator.md), run as
one ``slorouter sim`` process per term. For each policy a fresh pool is started (same seed: identical pods,
cold caches) with a `slorouter serve --config` gateway in front of it, and a load generator (asyncio +
aiohttp, in its own process) sends a warm-up phase, then the measured phase. Every policy gets the same
warm-up and the same measured arrival sequence (same seed); only the measured phase is reported.

``--front envoy`` puts Envoy + the ext_proc picker in front instead of the gateway: `slorouter epp --config
--envoy` (the same config; the picker, which starts Envoy as its child on gateway.host/port with the bootstrap
it generates, observed response path, override_host cluster), so the same requests go through Envoy and the
picker. What differs: the figures the load generator reads from the gateway's /metrics (the predictor's
readiness, its coverage, the tuner's and the deadlines' counters) come from the picker's metrics port; the
response headers (endpoint, route, predicted TTFT and TPOT) are the ones Envoy adds from the pick; the CPU is
the picker's and Envoy's (``picker``, ``envoy``; the table's ``picker+envoy``, "-" for Envoy if its process
was not found) instead of the gateway's. A ``+slo`` policy's hedges are Envoy's (docs/configuration.md
"Deadlines and hedges through Envoy"): the picker arms one as a per-try timeout only when its pick lists
another endpoint for the copy, which the built-in pipelines' picks do not (every hedge is
``skipped/no-endpoint``), and a copy would go out only while no response headers have come (the simulated pods
send a stream's headers at once): the gateway's hedges of a late first token or of a stalled stream have no
equivalent through Envoy.

Policies are ``slorouter bench``'s built-ins (slorouter.bench.policies), as scheduler configs of the
gateway: ``heuristic`` (the default profile: queue, KV-cache and prefix-cache scorers), ``heuristic-tuned``,
``token-aware`` and ``predicted-latency`` (the shipped pipeline with ``streamingMode: true``: TTFT and TPOT
models; the embedded predictor), or any scheduler config file (``NAME=PATH``). A gateway with a predictor
warms up until both models are served.

Workload (deterministic from --seed): Poisson arrivals of streamed chat completions
(``stream_options.include_usage``): short chat (one of 4 shared 64-token system prompts plus a unique
question, 100-300 prompt tokens) and long-context requests (one of 8 shared documents of 500-1,500 tokens
plus a unique part, 3,000-8,000 tokens), max_tokens uniform in 32..256. SLO headers ``x-slo-ttft-ms`` and
``x-slo-tpot-ms`` per class (--slo-chat, --slo-long); a request meets its SLO when it meets both. TTFT is
taken at the first SSE chunk carrying a token; TPOT = (E2E - TTFT) / (completion tokens - 1), with the
token count from the usage chunk.

Capacity is derived from the simulator's own latency model, not guessed: one pod's engine
(``slorouter.sim.engine.Engine``) of each pod class of the pool (profile and variant) is driven in virtual
time through this workload offered far above its capacity; its completions per virtual second in that
overload are the pod's maximum throughput, and the pool's capacity is their sum (the best any router could
do). The offered rate is --load (default 0.7) times that, unless --rate is given.

Why half the requests are long-context by default (--long-share 0.5): on the 2-core development machine a
streamed request costs about 20-30 ms of CPU in total (the pods, the gateway and the load generator each
handle one SSE chunk per token), so the machine drives about 60 streamed requests/s before CPU contention
distorts the latencies. An 80/20 chat/long mix has a derived capacity of about 32 req/s per pod, 257 req/s
for 8 pods (70%: 180 req/s, out of reach); at 50/50 the capacity is about 10 req/s per pod, so 70% of it
(about 55 req/s) fits, with the CPU of each process reported. ``--long-share 0.2`` runs the 80/20 mix.

    .venv/bin/python benchmarks/bench_quality_realtime.py [--duration 90] [--warmup 30] [--load 0.7]
        [--rate REQ_PER_S] [--seed 0] [--pool "8x llama3-8b-h100"] [--engine-variant SPEC]
        [--long-share 0.5] [--slo-chat 200 25] [--slo-long 600 35]
        [--policies heuristic,heuristic-tuned,token-aware,predicted-latency[,NAME=PATH]]
        [--front gateway|envoy] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from _harness import (
    ENVOY_ROUTINE,
    PROBLEM,
    SLOROUTER,
    envoy_pid,
    free_port,
    free_port_range,
    gateway_config,
    logged_process,
    markdown_table,
    objective_header,
    policy_name,
    router_command,
    uses_predictor,
)
from _loadgen import (
    CpuMeter,
    OpenLoop,
    StreamResult,
    count_by,
    latency_figures,
    loadgen_argv,
    measured_rows,
    percentile,
    poisson_offsets,
    prediction_ratio_counts,
    predictor_ready,
    record_row,
    router_coverage,
    row_tpot_ms,
    run_as_loadgen,
    slo_action_counters,
    stream_completion,
    tuning_counters,
    warm_up,
)

FRONTS = ("gateway", "envoy")
ROUTER_CPU = {"gateway": "gw", "envoy": "picker+envoy"}  # the report's CPU column
MODEL = "sim-llama3-8b"  # every pod of the pool serves this name, whatever its profile
# The capacity is a property of the workload's distribution: derived with one seed, so that --seed changes the
# arrival sequence but not the offered rate.
CAPACITY_SEED = 0
WARMUP_SEED_OFFSET = 1_000_003  # the warm-up sequence is another draw than the measured one
LETTERS = np.frombuffer(b"etaoinshrdlucmfwypvbgkqjxz", dtype=np.uint8)


# --- workload ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    long_share: float = 0.5
    chat_tokens: tuple[int, int] = (100, 300)
    long_tokens: tuple[int, int] = (3000, 8000)
    max_tokens: tuple[int, int] = (32, 256)
    system_prompts: int = 4
    system_prompt_tokens: int = 64
    documents: int = 8
    document_tokens: tuple[int, int] = (500, 1500)


@dataclass(frozen=True)
class Request:
    offset_s: float  # arrival, seconds after the phase's start
    kind: str  # "chat" or "long"
    prompt_tokens: int  # approximate (the chat template adds a few)
    max_tokens: int
    body: bytes


def _text(rng: np.random.Generator, tokens: int) -> str:
    """Random lower-case words, ``tokens`` tokens long for the simulator (4 bytes of text per token)."""
    data = LETTERS[rng.integers(0, len(LETTERS), tokens * 4)]
    data[rng.integers(3, 9) :: 7] = ord(" ")
    return data.tobytes().decode("ascii")


def _shared_texts(seed: int, workload: Workload) -> tuple[list[str], list[str]]:
    """System prompts and documents, the same for every phase and policy."""
    rng = np.random.default_rng([seed, 7])
    systems = [
        f"System prompt {i}. " + _text(rng, workload.system_prompt_tokens)
        for i in range(workload.system_prompts)
    ]
    low, high = workload.document_tokens
    documents = [
        f"Document {i}. Answer questions about it. " + _text(rng, int(rng.integers(low, high + 1)))
        for i in range(workload.documents)
    ]
    return systems, documents


def build_requests(seed: int, rate: float, duration_s: float, workload: Workload) -> list[Request]:
    """The phase's arrivals (Poisson at ``rate``) and bodies, all decided by ``seed``."""
    systems, documents = _shared_texts(0, workload)  # shared content does not depend on the phase's seed
    rng = np.random.default_rng(seed)
    requests: list[Request] = []
    for offset in poisson_offsets(rng, rate, duration_s):
        max_tokens = int(rng.integers(workload.max_tokens[0], workload.max_tokens[1] + 1))
        if rng.random() < workload.long_share:
            kind = "long"
            system = documents[int(rng.integers(len(documents)))]
            total = int(rng.integers(workload.long_tokens[0], workload.long_tokens[1] + 1))
            question = max(total - len(system) // 4, 200)
        else:
            kind = "chat"
            system = systems[int(rng.integers(len(systems)))]
            total = int(rng.integers(workload.chat_tokens[0], workload.chat_tokens[1] + 1))
            question = max(total - len(system) // 4, 16)
        body = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Question {len(requests)}: " + _text(rng, question)},
            ],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        prompt_tokens = len(system) // 4 + question
        requests.append(
            Request(offset, kind, prompt_tokens, max_tokens, json.dumps(body, separators=(",", ":")).encode())
        )
    return requests


# --- capacity ---------------------------------------------------------------------------------------------


def pool_capacity(profiles: list[Any], workload: Workload, seed: int) -> float:
    """The sum of the pods' maximum throughputs (one measurement per distinct pod class)."""
    per_class: dict[Any, float] = {}
    for profile in profiles:
        if profile not in per_class:
            per_class[profile] = pod_capacity(profile, workload, seed)
    return sum(per_class[p] for p in profiles)


def pod_capacity(
    profile: Any, workload: Workload, seed: int, overload_rate: float = 80.0, seconds: float = 60.0
) -> float:
    """Maximum throughput (requests/s) of one simulated pod on this workload, from its engine in virtual time.

    Requests arrive at ``overload_rate`` (far above capacity) for ``seconds``; completions are counted over
    the second half, when the queue is long and the engine runs as full as it can.
    """
    from slorouter.sim.engine import Engine
    from slorouter.tokenizer import chat_to_prompt, encode_array

    engine = Engine(profile, seed=seed)
    arrivals = []
    for r in build_requests(seed + 17, overload_rate, seconds, workload):
        messages = json.loads(r.body)["messages"]
        prompt = encode_array(chat_to_prompt(messages))
        arrivals.append((r.offset_s, prompt, r.max_tokens))
    now, i, finished = 0.0, 0, []
    while now < seconds:
        while i < len(arrivals) and arrivals[i][0] <= now:
            engine.add_request(i, arrivals[i][1], arrivals[i][2], arrivals[i][0])
            i += 1
        step = engine.plan_step(now)
        if step is None:
            wakeups = [
                t
                for t in (engine.next_ready_time(), arrivals[i][0] if i < len(arrivals) else None)
                if t is not None
            ]
            now = min(wakeups)
            continue
        finished += [event.finish_time for event in engine.commit_step(step).finished]
        now = step.end
    counted = [t for t in finished if seconds / 2 <= t < seconds]
    return len(counted) / (seconds / 2)


# --- load generator (its own process) ---------------------------------------------------------------------


@dataclass
class Result:
    phase: str
    index: int
    kind: str
    prompt_tokens: int
    max_tokens: int
    lag_ms: float  # how late the request left, against its scheduled arrival
    answer: StreamResult = field(default_factory=StreamResult)


# What a result records of its answer, in this order (the JSON rows of --json and of the summaries).
ANSWER_FIELDS = ("status", "ttft_ms", "e2e_ms", "completion_tokens", "route", "endpoint", "predicted_ttft_ms",
                 "predicted_tpot_ms", "error", "queued_ms", "dropped_reason")  # fmt: skip


async def run_load(spec: dict[str, Any]) -> dict[str, Any]:
    workload = Workload(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["workload"].items()})
    url = f"{spec['gateway']}/v1/chat/completions"
    metrics = spec["metrics"]  # the router's /metrics: the gateway's, or the picker's metrics port
    rate = spec["rate"]
    # The warm-up sequence is long enough to be extended while waiting for the predictor's models.
    extra = spec["max_extra_warmup_s"]
    warmup = build_requests(spec["seed"] + WARMUP_SEED_OFFSET, rate, spec["warmup_s"] + extra, workload)
    measured = build_requests(spec["seed"], rate, spec["duration_s"], workload)
    slo = {"chat": spec["slo_chat"], "long": spec["slo_long"]}
    headers = {
        kind: {
            "Content-Type": "application/json",
            "x-slo-ttft-ms": f"{t:g}",
            "x-slo-tpot-ms": f"{p:g}",
            **spec.get("objective_header", {}),
        }
        for kind, (t, p) in slo.items()
    }
    results: list[Result] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=spec["request_timeout_s"])
    sender = OpenLoop()
    loop = sender.loop
    info: dict[str, Any] = {"warmup_extended_s": 0.0, "ready_at_measured_start": None}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def send(phase: str, index: int, request: Request, due: float) -> None:
            def begin(sent: float, lag_ms: float) -> Coroutine[Any, Any, StreamResult]:
                result = Result(phase, index, request.kind, request.prompt_tokens, request.max_tokens, lag_ms)
                results.append(result)
                return stream_completion(
                    session, url, request.body, headers[request.kind], sent, result.answer
                )

            await sender.send(due, begin)

        start = loop.time()
        ready = (lambda: predictor_ready(session, metrics)) if spec["wait_ready"] else None
        warm_end = await warm_up(warmup, partial(send, "warmup"), start, spec["warmup_s"], extra, ready)
        info["warmup_extended_s"] = round(warm_end - start - spec["warmup_s"], 1)
        if spec["wait_ready"]:
            info["ready_at_measured_start"] = await predictor_ready(session, metrics)
        measured_start = max(loop.time(), warm_end)
        if measured_start > loop.time():
            await asyncio.sleep(measured_start - loop.time())
        ratios_before = await prediction_ratio_counts(session, metrics) if spec["wait_ready"] else {}
        tuning_before = await tuning_counters(session, metrics)
        slo_before = await slo_action_counters(session, metrics)
        cpu = CpuMeter(spec.get("pids", {}))
        for j, request in enumerate(measured):
            await send("measured", j, request, measured_start + request.offset_s)
        sending_done = loop.time()
        await sender.drain(spec["request_timeout_s"] + 5)
        info["drain_s"] = round(loop.time() - sending_done, 1)
        if spec["wait_ready"]:
            # What the gateway measured over the measured phase (the warm-up's last responses included).
            info["router_coverage"] = router_coverage(
                ratios_before, await prediction_ratio_counts(session, metrics)
            )
        if tuning_before:  # the self-tuning policy: its tuner over the measured phase
            after = await tuning_counters(session, metrics)
            info["tuning"] = {k: round(v - tuning_before.get(k, 0.0), 3) for k, v in after.items()}
        if slo_before:  # a +slo policy: its hedges and cancellations over the measured phase
            after = await slo_action_counters(session, metrics)
            info["slo_actions"] = {k: round(v - slo_before.get(k, 0.0), 3) for k, v in after.items()}
    wall = loop.time() - measured_start
    # CPU over the measured phase (its sending and its drain), in cores.
    info["cpu"] = {name: round(value, 2) for name, value in cpu.cores(wall).items()}
    info["measured_wall_s"] = round(wall, 1)
    return {"info": info, "results": [record_row(r, ANSWER_FIELDS) for r in results]}


# --- orchestration ----------------------------------------------------------------------------------------


POLICIES = ("heuristic", "heuristic-tuned", "token-aware", "predicted-latency")


def pool_processes(profiles: list[Any]) -> list[tuple[int, str, str]]:
    """(pods, base profile, engine variant) per ``slorouter sim`` process: runs of equal pod classes."""
    from slorouter.bench.pool import describe_pool, parse_pool

    groups: list[tuple[int, str, str]] = []
    for term in describe_pool(profiles).split(" + "):
        count, _, name = term.partition("x ")
        base, _, variant = name.partition("@")
        groups.append((int(count), base, variant))
    assert [
        p.name for p in parse_pool(" + ".join(f"{n}x {b}@{v}" if v else f"{n}x {b}" for n, b, v in groups))
    ] == [p.name for p in profiles]
    return groups


def run_policy(policy: str, name: str, args: argparse.Namespace, rate: float, tmp: Path) -> dict[str, Any]:
    """One policy (``policy``: a spec for ``resolve_policy``; ``name``: its label and file names)."""
    pods = len(args.profiles)
    sim_port = free_port_range(pods)
    gw_port = free_port()
    endpoints = [f"127.0.0.1:{sim_port + i}" for i in range(pods)]
    config_path = tmp / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(gateway_config(gw_port, endpoints, policy, args.seed)))
    router, metrics_port, router_ports = router_command(config_path, gw_port, envoy=args.front == "envoy")
    spec = {
        "gateway": f"http://127.0.0.1:{gw_port}",
        "metrics": f"http://127.0.0.1:{metrics_port}",
        "rate": rate,
        "seed": args.seed,
        "warmup_s": args.warmup,
        "duration_s": args.duration,
        "wait_ready": uses_predictor(policy),
        "objective_header": objective_header(policy),
        "max_extra_warmup_s": args.max_extra_warmup,
        "request_timeout_s": 120.0,
        "slo_chat": args.slo_chat,
        "slo_long": args.slo_long,
        "workload": asdict(Workload(long_share=args.long_share)),
    }
    spec_path, out_path = tmp / f"{name}-spec.json", tmp / f"{name}-out.json"
    spec_path.write_text(json.dumps(spec))
    logs = []
    with contextlib.ExitStack() as stack:
        first = 0
        pids: dict[str, int] = {}
        for i, (count, profile, variant) in enumerate(pool_processes(args.profiles)):
            # Pod j of the pool seeds its jitter with seed + j, whichever process runs it.
            sim = [*SLOROUTER, "sim", "--pods", str(count), "--port", str(sim_port + first),
                   "--profile", profile, "--engine-variant", variant, "--model", MODEL,
                   "--seed", str(args.seed + first)]  # fmt: skip
            logs.append(f"{name}-sim{i}")
            ports = [sim_port + first + j for j in range(count)]
            pids[f"sim{i}"] = stack.enter_context(logged_process(sim, ports, tmp / f"{logs[-1]}.log")).pid
            first += count
        logs.append(f"{name}-{args.front}")
        pid = stack.enter_context(logged_process(router, router_ports, tmp / f"{logs[-1]}.log")).pid
        if args.front == "gateway":
            pids["gateway"] = pid
        else:
            pids["picker"] = pid
            envoy = envoy_pid(pid)
            if envoy is not None:  # else its CPU is reported as missing
                pids["envoy"] = envoy
        spec["pids"] = pids
        spec_path.write_text(json.dumps(spec))
        loadgen = subprocess.run(loadgen_argv(__file__, spec_path, out_path))
        if loadgen.returncode != 0:
            raise SystemExit(f"{name}: the load generator failed ({loadgen.returncode})")
    for log in logs:
        text = (tmp / f"{log}.log").read_text(errors="replace")
        lines = text.splitlines()
        problems = [line for line in lines if PROBLEM.search(line) and not ENVOY_ROUTINE.search(line)]
        if problems:
            print(f"{log} log (last problems):\n" + "\n".join(problems[-5:]), file=sys.stderr)
    output: dict[str, Any] = json.loads(out_path.read_text())
    cpu = output["info"]["cpu"]
    cpu["sim"] = round(sum(v for k, v in cpu.items() if k.startswith("sim")), 2)
    return output


# --- report -----------------------------------------------------------------------------------------------


def summarize(output: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    rows, ok = measured_rows(output)
    slo = {"chat": args.slo_chat, "long": args.slo_long}
    tpot, pct = row_tpot_ms, percentile

    def met(r: dict[str, Any]) -> bool:
        ttft_slo, tpot_slo = slo[r["kind"]]
        return r["ttft_ms"] <= ttft_slo and tpot(r) <= tpot_slo

    summary = latency_figures(rows, ok)
    summary["slo"] = sum(map(met, ok)) / max(len(rows), 1)  # errors count as misses
    for kind in ("chat", "long"):
        of_kind = [r for r in ok if r["kind"] == kind]
        summary[f"{kind}_ttft_p90"] = pct([r["ttft_ms"] for r in of_kind], 90)
        # Per class, because with half the requests long the pool's TPOT p50 falls between the two classes
        # (chat streams on pods without long prefills, long ones beside them): it is set by the slowest chat
        # and the fastest long streams and moves 15-20 % between runs of one policy on the same arrivals.
        summary[f"{kind}_tpot_p50"] = pct([tpot(r) for r in of_kind], 50)
        summary[f"{kind}_slo"] = sum(map(met, of_kind)) / max(sum(r["kind"] == kind for r in rows), 1)
    summary["routes"] = count_by(rows, "route")
    predicted = [r for r in ok if not math.isnan(r["predicted_ttft_ms"])]
    if predicted:  # the model predicts a quantile (p90 by default): coverage should be near it
        n = len(predicted)
        summary["ttft_coverage"] = sum(r["ttft_ms"] <= r["predicted_ttft_ms"] for r in predicted) / n
        summary["tpot_coverage"] = sum(tpot(r) <= r["predicted_tpot_ms"] for r in predicted) / n
        for kind in ("chat", "long"):
            of_kind = [r for r in predicted if r["kind"] == kind]
            covered = sum(r["ttft_ms"] <= r["predicted_ttft_ms"] for r in of_kind)
            summary[f"{kind}_ttft_coverage"] = covered / len(of_kind) if of_kind else math.nan
    summary["requests_per_pod"] = sorted(count_by(ok, "endpoint").values())
    lags = [r["lag_ms"] for r in rows]
    summary["lag_p99_ms"] = pct(lags, 99)
    summary["achieved_rate"] = len(rows) / args.duration
    return summary


def main() -> None:
    if run_as_loadgen(run_load):
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--duration", type=float, default=90.0, help="measured seconds per policy")
    parser.add_argument("--warmup", type=float, default=30.0, help="warm-up seconds per policy (excluded)")
    parser.add_argument(
        "--max-extra-warmup",
        type=float,
        default=60.0,
        help="longest extension of the predicted warm-up while its models are not served",
    )
    parser.add_argument("--load", type=float, default=0.7, help="offered load as a share of the capacity")
    parser.add_argument("--rate", type=float, default=None, help="requests/s (overrides --load)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pool", default="8x llama3-8b-h100", help="slorouter bench's pool spec, engine variants included"
    )
    parser.add_argument("--engine-variant", default="", metavar="SPEC", help="engine variant of every pod")
    parser.add_argument("--long-share", type=float, default=0.5, help="share of long-context requests")
    parser.add_argument(
        "--slo-chat",
        type=float,
        nargs=2,
        default=(200.0, 25.0),
        metavar=("TTFT", "TPOT"),
        help="SLOs in ms of short chat requests",
    )
    parser.add_argument(
        "--slo-long",
        type=float,
        nargs=2,
        default=(600.0, 35.0),
        metavar=("TTFT", "TPOT"),
        help="SLOs in ms of long-context requests",
    )
    parser.add_argument(
        "--policies",
        default="heuristic,heuristic-tuned,token-aware,predicted-latency",
        help=f"which policies to run, in order: built-ins ({', '.join(POLICIES)}, ...) or NAME=PATH",
    )
    parser.add_argument(
        "--front",
        choices=FRONTS,
        default="gateway",
        help="gateway: `slorouter serve`; envoy: Envoy + the ext_proc picker (`slorouter epp --envoy`)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args()
    from slorouter.bench.policies import PolicyError

    try:
        names = [policy_name(policy) for policy in args.policies.split(",")]
    except (PolicyError, ValueError) as exc:
        parser.error(f"--policies: {exc}")
    if len(set(names)) != len(names):
        parser.error(f"--policies: a name appears twice ({', '.join(names)})")

    from slorouter.bench.pool import describe_pool, parse_pool
    from slorouter.sim.variants import parse_variant

    try:
        args.profiles = parse_pool(args.pool, parse_variant(args.engine_variant))
    except ValueError as exc:
        parser.error(f"--pool / --engine-variant: {exc}")
    args.pool_description = describe_pool(args.profiles)
    workload = Workload(long_share=args.long_share)
    started = time.monotonic()
    capacity = pool_capacity(args.profiles, workload, CAPACITY_SEED)
    rate = args.rate if args.rate is not None else args.load * capacity
    print(f"capacity of {args.pool_description}: {capacity:.0f} req/s (engines in virtual time, overloaded); "
          f"offered {rate:.1f} req/s ({rate / capacity:.0%})", flush=True)  # fmt: skip
    outputs: dict[str, dict[str, Any]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policies.split(","):
            name = policy_name(policy)
            outputs[name] = run_policy(policy, name, args, rate, Path(tmp))
            summaries[name] = summarize(outputs[name], args)
            info = outputs[name]["info"]
            print(f"{name}: {summaries[name]['requests']} measured requests; {info}", flush=True)
    if args.json:
        written = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "profiles"}
        args.json.write_text(json.dumps({"args": written, "outputs": outputs}))
    print()
    print(report(summaries, outputs, args, rate, capacity))
    print(f"\nwall time {time.monotonic() - started:.0f} s; command: .venv/bin/python {shlex.join(sys.argv)}")


def report(
    summaries: dict[str, dict[str, Any]],
    outputs: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    rate: float,
    capacity: float,
) -> str:
    headers = ["policy", "requests", "errors", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "TPOT p50 ms",
               "TPOT p90 ms",
               "E2E p50 ms", "SLO attainment", "chat TTFT p90", "long TTFT p90", "chat TPOT p50",
               "long TPOT p50", f"CPU cores sim/{ROUTER_CPU[args.front]}/loadgen"]  # fmt: skip
    rows = []
    for name, s in summaries.items():
        cpu = outputs[name]["info"]["cpu"]
        rows.append([
            name, s["requests"], s["errors"], f"{s['ttft_p50']:.0f}", f"{s['ttft_p90']:.0f}",
            f"{s['ttft_p99']:.0f}", f"{s['tpot_p50']:.1f}", f"{s['tpot_p90']:.1f}", f"{s['e2e_p50']:.0f}",
            f"{s['slo']:.1%}",
            f"{s['chat_ttft_p90']:.0f}", f"{s['long_ttft_p90']:.0f}",
            f"{s['chat_tpot_p50']:.1f}", f"{s['long_tpot_p50']:.1f}",
            f"{cpu['sim']:.2f}/{router_cpu(cpu)}/{cpu['loadgen']:.2f}",
        ])  # fmt: skip
    keys = ["ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "e2e_p50", "slo"]
    keys += ["chat_ttft_p90", "long_ttft_p90", "chat_tpot_p50", "long_tpot_p50"]
    for base in ("heuristic", "token-aware"):
        b = summaries.get(base)
        for name in summaries:
            p = summaries[name]
            if b is None or not name.startswith("predicted"):
                continue
            ratio = [f"{p[k] / b[k]:.2f}" if b[k] else "-" for k in keys]
            rows.append([f"{name} / {base}", "", "", *ratio, ""])
    lines = [markdown_table(headers, rows), ""]
    lines.append(
        f"pool `{args.pool_description}`, capacity {capacity:.0f} req/s (derived), offered {rate:.1f} req/s "
        f"({rate / capacity:.0%}), {args.duration:g} s measured after {args.warmup:g} s warm-up, "
        f"seed {args.seed}; "
        f"SLOs chat TTFT {args.slo_chat[0]:g} ms / TPOT {args.slo_chat[1]:g} ms, long-context TTFT "
        f"{args.slo_long[0]:g} ms / TPOT {args.slo_long[1]:g} ms."
        + (" Through Envoy + the ext_proc picker (`slorouter epp --envoy`)." if args.front == "envoy" else "")
    )
    for name, s in summaries.items():
        info = outputs[name]["info"]
        lines.append(
            f"{name}: routes {s['routes']}; requests per pod {s['requests_per_pod']}; "
            + (
                f"prediction coverage TTFT {s['ttft_coverage']:.0%} (chat {s['chat_ttft_coverage']:.0%}, "
                f"long {s['long_ttft_coverage']:.0%}) TPOT {s['tpot_coverage']:.0%} against the load "
                f"generator's clock, {_coverage_text(info.get('router_coverage', {}))} against the "
                f"{'gateway' if args.front == 'gateway' else 'picker'}'s; "
                if "ttft_coverage" in s
                else ""
            )
            + f"achieved {s['achieved_rate']:.1f} req/s; send lag p99 "
            f"{s['lag_p99_ms']:.1f} ms; warm-up extended {info['warmup_extended_s']} s; "
            f"CPU over the measured phase, cores: {info['cpu']}"
            + (f"; tuner over the measured phase: {info['tuning']}" if "tuning" in info else "")
            + (f"; deadlines and hedges: {info['slo_actions']}" if "slo_actions" in info else "")
        )
    return "\n".join(lines)


def router_cpu(cpu: dict[str, float]) -> str:
    """The router's cores: the gateway's, or the picker's and Envoy's ("-" for a figure not taken)."""
    names = ["gateway"] if "gateway" in cpu else ["picker", "envoy"]
    return "+".join(f"{cpu[n]:.2f}" if n in cpu else "-" for n in names)


def _coverage_text(coverage: dict[str, float]) -> str:
    shares = sorted(coverage.items(), reverse=True)  # ttft, then tpot
    return ", ".join(f"{model.upper()} {share:.0%}" for model, share in shares) or "-"


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
