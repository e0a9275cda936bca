"""Routing on real engines: the policies of ``slorouter bench`` through the gateway in front of llama.cpp's
``llama-server`` (Gemma 3 270M on the CPU), and the same run on simulated pods of the profile fitted to it.

Pools (``--pool``), two servers each, every slot with 1,024 tokens of context, one thread per server:

- ``homogeneous``: two servers with ``--parallel 4 --ctx-size 4096``;
- ``mixed``: one of those and one with ``--parallel 1 --ctx-size 1024`` (one slot: its requests queue
  where the other server's share the CPU thread).

With ``--sim`` each llama-server is a ``slorouter sim`` pod of the profile ``llamacpp-gemma3-270m-cpu``
(benchmarks/fit_llamacpp_profile.py; the one-slot server is its variant ``max-seqs=1`` with a quarter of the
cache), serving llama.cpp's metrics page without KV gauges, as llama-server does.

Every run (one policy, one seed) starts fresh servers (nothing cached: llama-server keeps prompts in its
slots and in RAM) and a fresh ``slorouter serve`` gateway, then a load generator in its own process
(asyncio + aiohttp) sends a warm-up (not measured) and the measured phase: the same Poisson arrivals for
every policy of a seed. Streamed chat completions with ``stream_options.include_usage`` and ``ignore_eos``
(every reply is ``max_tokens`` long, as in the simulator): natural English (prose of this repository's
documentation at a fixed commit, benchmarks/_llama.py); 75 % of the requests open with one of 4 shared
system prompts (about 200 Gemma tokens), all have a unique passage and question (about 50-220 tokens);
``max_tokens`` uniform in 100..120. TTFT is taken at the first SSE chunk carrying a token; TPOT = (E2E -
TTFT) / (completion tokens - 1), with the count from the usage chunk. Each response's cached prompt tokens
(``usage.prompt_tokens_details.cached_tokens``; llama-server's ``timings.cache_n``) give the cache reuse.

Policies are bench_quality_realtime.py's (``slorouter bench``'s built-ins as gateway configs); the
embedded predictor of ``predicted-latency`` trains on fewer samples than its defaults (``--min-samples``,
retrained every second) so that it routes by prediction after the warm-up, which is extended (up to
``--max-extra-warmup``) until both its models are served. The offered rate is ``--rate``, or ``--load``
times the pool's capacity derived from the fitted profile's engine in virtual time (overloaded).

Each run writes its raw results to ``--out DIR`` (one JSON file per pool, engine, policy and seed) and the
gateway's recording of the traffic it served beside it (``*.trace.jsonl``, warm-up included), which
``slorouter bench --trace`` replays in virtual time on the fitted profile; ``--report DIR`` reads a
directory and prints the tables (per seed and median, ratios to heuristic, real against sim).

    .venv/bin/python benchmarks/bench_realengine.py [--sim] [--pool homogeneous|mixed] [--seeds 0,1,2]
        [--policies heuristic,token-aware,predicted-latency] [--warmup 40] [--duration 70] [--load 0.6]
        [--rate REQ_PER_S] [--out results/realengine]
    .venv/bin/python benchmarks/bench_realengine.py --report results/realengine
    .venv/bin/python benchmarks/bench_realengine.py --virtual [--pool ...] [--seeds 0,1,...,9] [...]

``--virtual`` runs the same requests through ``slorouter bench``'s discrete-event cluster on the fitted
profile's pods in virtual time, and prints a table (medians over the seeds, ratios to the first policy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from _harness import (
    ROOT,
    SLOROUTER,
    free_port,
    free_port_range,
    gateway_config,
    logged_process,
    markdown_table,
    policy_name,
    uses_predictor,
)
from _llama import MODEL, ServerSpec, corpus, llama_server
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
    stream_completion,
    warm_up,
)

SIM_PROFILE = "llamacpp-gemma3-270m-cpu"
POOLS: dict[str, list[ServerSpec]] = {
    "homogeneous": [ServerSpec(4, 4096), ServerSpec(4, 4096)],
    "mixed": [ServerSpec(4, 4096), ServerSpec(1, 1024)],
}
WARMUP_SEED_OFFSET = 1_000_003
# The embedded predictor's training for this benchmark: the shipped defaults wait for 200 samples and
# retrain every 5 s, which a 2-core CPU pool (about one request a second) reaches only after minutes.
TRAINING = {"min_samples": 30, "retrain_interval_s": 1.0}


# --- workload ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    system_share: float = 0.75  # requests that open with a shared system prompt
    system_prompts: int = 4
    system_chars: tuple[int, int] = (600, 800)  # about 170-230 Gemma tokens
    user_chars: tuple[int, int] = (100, 700)  # about 30-200
    max_tokens: tuple[int, int] = (100, 120)


@dataclass(frozen=True)
class Request:
    offset_s: float
    kind: str  # "system" (a shared system prompt) or "plain"
    prompt_chars: int
    max_tokens: int
    body: bytes


def _passage(text: str, rng: np.random.Generator, chars: int) -> str:
    """``chars`` characters of ``text`` from a random word boundary."""
    start = int(rng.integers(0, len(text) - chars - 200))
    start = text.index(" ", start) + 1
    end = text.index(" ", start + chars)
    return text[start:end]


def build_requests(seed: int, rate: float, duration_s: float, workload: Workload) -> list[Request]:
    text = " ".join(corpus())
    shared = np.random.default_rng([0, 7])  # the system prompts are the same for every seed and phase
    systems = [
        f"You are assistant {i} of the slorouter project. Answer from the documentation below, in plain "
        "words.\n\n" + _passage(text, shared, int(shared.integers(*workload.system_chars)))
        for i in range(workload.system_prompts)
    ]
    rng = np.random.default_rng(seed)
    requests: list[Request] = []
    for offset in poisson_offsets(rng, rate, duration_s):
        max_tokens = int(rng.integers(workload.max_tokens[0], workload.max_tokens[1] + 1))
        user = _passage(text, rng, int(rng.integers(*workload.user_chars)))
        question = f"Question {seed}-{len(requests)}: what does this passage say, and why?\n\n{user}"
        messages = [{"role": "user", "content": question}]
        kind = "plain"
        if rng.random() < workload.system_share:
            kind = "system"
            messages.insert(0, {"role": "system", "content": systems[int(rng.integers(len(systems)))]})
        body = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        chars = sum(len(m["content"]) for m in messages)
        requests.append(Request(offset, kind, chars, max_tokens, json.dumps(body).encode()))
    return requests


# --- capacity (the fitted profile's engine, virtual time) -------------------------------------------------


def sim_variants(servers: list[ServerSpec]) -> list[str]:
    """The engine variant of the fitted profile for each server (its slots and its share of the cache)."""
    from slorouter.sim.profiles import get_profile

    profile = get_profile(SIM_PROFILE)
    base = POOLS["homogeneous"][0]
    variants = []
    for server in servers:
        if server.ctx_per_slot != base.ctx_per_slot:
            raise SystemExit(f"{server.describe()}: the profile models {base.ctx_per_slot} tokens a slot")
        if server == base:
            variants.append("")
        else:
            blocks = profile.num_gpu_blocks * server.ctx_size // base.ctx_size
            variants.append(f"max-seqs={server.parallel},kv-blocks={blocks}")
    return variants


def pool_capacity(servers: list[ServerSpec], workload: Workload, seconds: float = 600.0) -> float:
    """Requests/s the pool's simulated engines complete when overloaded (the second half of the run)."""
    from slorouter.sim.engine import Engine
    from slorouter.sim.profiles import get_profile
    from slorouter.sim.variants import apply_variant
    from slorouter.tokenizer import chat_to_prompt, encode_array

    arrivals = [
        (r.offset_s, encode_array(chat_to_prompt(json.loads(r.body)["messages"])), r.max_tokens)
        for r in build_requests(17, 10.0, seconds, workload)
    ]
    total = 0.0
    for variant in sim_variants(servers):
        engine = Engine(apply_variant(get_profile(SIM_PROFILE), variant), seed=0)
        now, i, finished = 0.0, 0, []
        while now < seconds:
            while i < len(arrivals) and arrivals[i][0] <= now:
                engine.add_request(i, arrivals[i][1], arrivals[i][2], arrivals[i][0])
                i += 1
            step = engine.plan_step(now)
            if step is None:
                now = min(t for t in (engine.next_ready_time(), arrivals[i][0]) if t is not None)
                continue
            finished += [event.finish_time for event in engine.commit_step(step).finished]
            now = step.end
        total += sum(seconds / 2 <= t < seconds for t in finished) / (seconds / 2)
    return total


# --- load generator (its own process) ---------------------------------------------------------------------


@dataclass
class Result:
    phase: str
    index: int
    kind: str
    prompt_chars: int
    max_tokens: int
    lag_ms: float
    answer: StreamResult = field(default_factory=StreamResult)


# What a result records of its answer, in this order (the JSON rows of --out).
ANSWER_FIELDS = ("status", "ttft_ms", "e2e_ms", "completion_tokens", "prompt_tokens", "cached_tokens",
                 "route", "endpoint", "predicted_ttft_ms", "predicted_tpot_ms", "error",
                 "timings")  # fmt: skip
JSON_HEADERS = {"Content-Type": "application/json"}


async def run_load(spec: dict[str, Any]) -> dict[str, Any]:
    workload = Workload(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["workload"].items()})
    base, rate, extra = spec["gateway"], spec["rate"], spec["max_extra_warmup_s"]
    url = f"{base}/v1/chat/completions"
    warmup = build_requests(spec["seed"] + WARMUP_SEED_OFFSET, rate, spec["warmup_s"] + extra, workload)
    measured = build_requests(spec["seed"], rate, spec["duration_s"], workload)
    results: list[Result] = []
    sender = OpenLoop()
    loop = sender.loop
    info: dict[str, Any] = {"warmup_extended_s": 0.0}
    timeout = aiohttp.ClientTimeout(total=spec["request_timeout_s"])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:

        async def send(phase: str, index: int, request: Request, due: float) -> None:
            def begin(sent: float, lag_ms: float) -> Coroutine[Any, Any, StreamResult]:
                result = Result(phase, index, request.kind, request.prompt_chars, request.max_tokens, lag_ms)
                results.append(result)
                return stream_completion(session, url, request.body, JSON_HEADERS, sent, result.answer,
                                         tail_bytes=16384, error_chars=300)  # fmt: skip

            await sender.send(due, begin)

        start = loop.time()
        ready = (lambda: predictor_ready(session, base)) if spec["wait_ready"] else None
        warm_end = await warm_up(warmup, partial(send, "warmup"), start, spec["warmup_s"], extra, ready)
        info["warmup_extended_s"] = round(warm_end - start - spec["warmup_s"], 1)
        info["predictor_ready"] = await predictor_ready(session, base) if spec["wait_ready"] else None
        measured_start = max(loop.time(), warm_end)
        if measured_start > loop.time():
            await asyncio.sleep(measured_start - loop.time())
        ratios_before = await prediction_ratio_counts(session, base) if spec["wait_ready"] else {}
        cpu = CpuMeter(spec["pids"])
        pages_before = [await _page(session, server) for server in spec["servers"]]
        for j, request in enumerate(measured):
            await send("measured", j, request, measured_start + request.offset_s)
        sending_done = loop.time()
        await sender.drain(spec["request_timeout_s"] + 5)
        wall = loop.time() - measured_start
        info["drain_s"] = round(loop.time() - sending_done, 1)
        info["cpu"] = {name: round(value, 3) for name, value in cpu.cores(wall).items()}
        pages_after = [await _page(session, server) for server in spec["servers"]]
        info["server_counters"] = [
            {k: after.get(k, math.nan) - before.get(k, math.nan) for k in after if k.endswith("_total")}
            for before, after in zip(pages_before, pages_after, strict=True)
        ]
        if spec["wait_ready"]:
            info["router_coverage"] = router_coverage(
                ratios_before, await prediction_ratio_counts(session, base)
            )
    info["measured_wall_s"] = round(wall, 1)
    return {"info": info, "results": [record_row(r, ANSWER_FIELDS) for r in results]}


async def _page(session: Any, server: str) -> dict[str, float]:
    """A server's metrics page, unlabelled series only (llama.cpp's page has no labels)."""
    try:
        async with session.get(f"{server}/metrics") as response:
            text = await response.text()
    except Exception:
        return {}
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                values[name] = float(value)
    return values


# --- orchestration ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def servers_up(
    servers: list[ServerSpec], sim: bool, seed: int, tmp: Path
) -> Iterator[tuple[list[str], dict[str, int]]]:
    """Fresh servers (llama-server, or ``slorouter sim`` pods of the fitted profile); yields their
    addresses and process ids."""
    with contextlib.ExitStack() as stack:
        addresses, pids = [], {}
        if sim:
            base = free_port_range(len(servers))
            for i, variant in enumerate(sim_variants(servers)):
                port = base + i
                argv = [*SLOROUTER, "sim", "--pods", "1", "--port", str(port), "--profile", SIM_PROFILE,
                        "--engine-variant", variant, "--engine", "llamacpp", "--model", MODEL,
                        "--seed", str(seed + i)]  # fmt: skip
                pids[f"server{i}"] = stack.enter_context(
                    logged_process(argv, [port], tmp / f"sim{i}.log")
                ).pid
                addresses.append(f"127.0.0.1:{port}")
        else:
            for i, server in enumerate(servers):
                proc, url = stack.enter_context(llama_server(server, tmp / f"llama-server{i}.log"))
                pids[f"server{i}"] = proc.pid
                addresses.append(url.removeprefix("http://"))
        yield addresses, pids


def run_one(
    args: argparse.Namespace, policy: str, seed: int, rate: float, tmp: Path, trace: Path
) -> dict[str, Any]:
    servers = POOLS[args.pool]
    with servers_up(servers, args.sim, seed, tmp) as (addresses, pids):
        port = free_port()
        config = gateway_config(port, addresses, policy, seed)
        if "predictor" in config:
            config["predictor"]["embedded"].update(TRAINING)
        config_path = tmp / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config))
        trace.unlink(missing_ok=True)
        serve = [*SLOROUTER, "serve", "--config", str(config_path), "--log-level", "WARNING",
                 "--record", str(trace)]  # fmt: skip
        with logged_process(serve, [port], tmp / "gateway.log") as gateway:
            spec = {
                "gateway": f"http://127.0.0.1:{port}",
                "servers": [f"http://{a}" for a in addresses],
                "rate": rate,
                "seed": seed,
                "warmup_s": args.warmup,
                "duration_s": args.duration,
                "wait_ready": uses_predictor(policy),
                "max_extra_warmup_s": args.max_extra_warmup,
                "request_timeout_s": 180.0,
                "workload": asdict(Workload()),
                "pids": {**pids, "gateway": gateway.pid},
            }
            spec_path, out_path = tmp / "spec.json", tmp / "out.json"
            spec_path.write_text(json.dumps(spec))
            loadgen = _run(loadgen_argv(__file__, spec_path, out_path))
            if loadgen != 0:
                raise SystemExit(f"the load generator failed ({loadgen})")
    output: dict[str, Any] = json.loads(out_path.read_text())
    gateway_log = (tmp / "gateway.log").read_text(errors="replace").splitlines()
    output["info"]["gateway_log_tail"] = [
        line for line in gateway_log if "WARNING" in line or "ERROR" in line
    ][-5:]
    return output


def _run(argv: list[str]) -> int:
    import subprocess

    return subprocess.run(argv, cwd=ROOT).returncode


def virtual_time(args: argparse.Namespace, rate: float) -> None:
    """The same requests (warm-up and measured phase) through ``slorouter bench``'s discrete-event cluster
    on the fitted profile's pods, in virtual time: many seeds in minutes, and the runs' length free of the
    real engine's cost. The predictor trains as in the real runs (``TRAINING``); the warm-up is not
    extended (the predictor is ready within it at these rates)."""
    from slorouter.bench.cluster import ClusterSettings, ClusterSimulator
    from slorouter.bench.policies import resolve_policy
    from slorouter.bench.workloads.request import BenchRequest
    from slorouter.sim.profiles import get_profile
    from slorouter.sim.variants import apply_variant
    from slorouter.tokenizer import chat_to_prompt

    workload = Workload()
    base = get_profile(SIM_PROFILE)
    profiles = [apply_variant(base, v) if v else base for v in sim_variants(POOLS[args.pool])]
    settings = ClusterSettings(
        min_samples=int(TRAINING["min_samples"]),
        retrain_interval_s=TRAINING["retrain_interval_s"],
        model=MODEL,
    )
    rows: dict[str, list[list[float]]] = {}
    for seed in args.seeds:
        warm = build_requests(seed + WARMUP_SEED_OFFSET, rate, args.warmup, workload)
        measured = build_requests(seed, rate, args.duration, workload)
        requests = [
            BenchRequest(start + r.offset_s, chat_to_prompt(json.loads(r.body)["messages"]), r.max_tokens)
            for start, phase in ((0.0, warm), (args.warmup, measured))
            for r in phase
        ]
        for policy in args.policies:
            resolved = resolve_policy(policy)
            with ClusterSimulator.of_policy(profiles, resolved, settings=settings, seed=seed) as sim:
                rec = sim.run(requests)
            ttft = rec.ttft_s[len(warm) :] * 1e3
            ttft = ttft[np.isfinite(ttft)]
            tpot = rec.tpot_ms[len(warm) :]
            row = [*np.percentile(ttft, [50, 90, 99]), float(np.nanmedian(tpot)), float(len(ttft))]
            rows.setdefault(resolved.name, []).append(row)
            print(f"seed {seed} {resolved.name}: TTFT p50/p90/p99 {row[0]:.0f}/{row[1]:.0f}/{row[2]:.0f} ms, "
                  f"TPOT p50 {row[3]:.1f} ms, {row[4]:.0f} measured", flush=True)  # fmt: skip
    base_name = policy_name(args.policies[0])
    table = []
    for name, values in rows.items():
        medians = np.median(np.array(values), axis=0)
        ratios = [medians[k] / np.median(np.array(rows[base_name]), axis=0)[k] for k in range(4)]
        table.append([name, *(_fmt(v) for v in medians[:3]), _fmt(medians[3], 1),
                      *(f"{r:.2f}×" for r in ratios[:3])])  # fmt: skip
    seeds = ",".join(map(str, args.seeds))
    print(f"\n{args.pool} pool, virtual time, {rate:.2f} req/s, {args.warmup:g} s warm-up + "
          f"{args.duration:g} s measured, medians over seeds {seeds}:\n")  # fmt: skip
    print(markdown_table(["policy", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "TPOT p50 ms",
                          f"p50 ÷ {base_name}", "p90 ÷", "p99 ÷"], table))  # fmt: skip


def run_command(args: argparse.Namespace) -> None:
    servers = POOLS[args.pool]
    workload = Workload()
    capacity = pool_capacity(servers, workload)
    rate = args.rate if args.rate is not None else args.load * capacity
    if args.virtual:
        virtual_time(args, rate)
        return
    engine = "sim" if args.sim else "real"
    print(f"pool {args.pool} ({'; '.join(s.describe() for s in servers)}), {engine}: capacity {capacity:.2f} "
          f"req/s (fitted profile, virtual time), offered {rate:.2f} req/s", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for policy in args.policies:
            name = policy_name(policy)
            started = time.monotonic()
            stem = f"{args.pool}-{engine}-{name}-seed{seed}"
            with tempfile.TemporaryDirectory() as tmp:
                output = run_one(args, policy, seed, rate, Path(tmp), args.out / f"{stem}.trace.jsonl")
            output["run"] = {"pool": args.pool, "engine": engine, "policy": name, "seed": seed, "rate": rate,
                             "capacity": capacity, "warmup_s": args.warmup, "duration_s": args.duration,
                             "servers": [s.describe() for s in servers], "command": " ".join(sys.argv),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}  # fmt: skip
            path = args.out / f"{stem}.json"
            path.write_text(json.dumps(output))
            s = summarize(output)
            print(f"{path.name}: {s['requests']} measured, {s['errors']} errors, TTFT p50/p90/p99 "
                  f"{s['ttft_p50']:.0f}/{s['ttft_p90']:.0f}/{s['ttft_p99']:.0f} ms, "
                  f"TPOT p50 {s['tpot_p50']:.1f} ms, "
                  f"routes {s['routes']}, cached {s['cached_share']:.0%}, CPU {output['info']['cpu']}, "
                  f"{time.monotonic() - started:.0f} s", flush=True)  # fmt: skip


# --- report -----------------------------------------------------------------------------------------------


def summarize(output: dict[str, Any]) -> dict[str, Any]:
    rows, ok = measured_rows(output)
    s = latency_figures(rows, ok)
    s["tpot_p99"] = percentile([row_tpot_ms(r) for r in ok], 99)
    s["prompt_tokens_mean"] = statistics.fmean(r["prompt_tokens"] for r in ok) if ok else math.nan
    routes = count_by(rows, "route")
    s["routes"] = routes
    s["predicted_share"] = routes.get("predicted", 0) / max(len(rows), 1)
    # Prompt-cache reuse: the share of the measured requests' prompt tokens the engine did not evaluate.
    with_usage = [r for r in ok if r["cached_tokens"] >= 0 and r["prompt_tokens"] > 0]
    prompt = sum(r["prompt_tokens"] for r in with_usage)
    s["cached_share"] = sum(r["cached_tokens"] for r in with_usage) / prompt if prompt else math.nan
    system = [r for r in with_usage if r["kind"] == "system"]
    s["system_hit_share"] = sum(r["cached_tokens"] > 0 for r in system) / len(system) if system else math.nan
    predicted = [r for r in ok if not math.isnan(r["predicted_ttft_ms"])]
    if predicted:
        actual = np.array([r["ttft_ms"] for r in predicted])
        served = np.array([r["predicted_ttft_ms"] for r in predicted])
        s["ttft_coverage"] = float(np.mean(actual <= served))
        s["ttft_mape"] = float(np.mean(np.abs(served - actual) / actual))
        s["ttft_actual_over_predicted_p50"] = float(np.median(actual / served))
        with_tpot = [r for r in predicted if not math.isnan(r["predicted_tpot_ms"])]
        if with_tpot:
            actual = np.array([row_tpot_ms(r) for r in with_tpot])
            served = np.array([r["predicted_tpot_ms"] for r in with_tpot])
            s["tpot_coverage"] = float(np.mean(actual <= served))
            s["tpot_mape"] = float(np.mean(np.abs(served - actual) / actual))
    pods = count_by(ok, "endpoint")
    s["requests_per_server"] = [pods[k] for k in sorted(pods)]
    # Per server, busiest streams first: (requests, TTFT p50, TPOT p50).
    per_server = []
    for endpoint in pods:
        mine = [r for r in ok if r["endpoint"] == endpoint]
        per_server.append(
            (
                len(mine),
                percentile([r["ttft_ms"] for r in mine], 50),
                percentile([row_tpot_ms(r) for r in mine], 50),
            )
        )
    s["servers"] = sorted(per_server, key=lambda row: -row[2])
    # TTFT p90 in each fifth of the measured phase, in arrival order: a queue that keeps growing (a load the
    # pool does not sustain) shows as a rising sequence, a steady state as a flat one.
    s["ttft_p90_by_fifth"] = [
        percentile([r["ttft_ms"] for r in ok[k * len(ok) // 5 : (k + 1) * len(ok) // 5]], 90)
        for k in range(5)
    ]
    cpu = output["info"]["cpu"]
    servers_cpu = sum(v for k, v in cpu.items() if k.startswith("server"))
    s["cpu_gateway"] = cpu["gateway"]
    s["cpu_servers"] = servers_cpu
    s["cpu_loadgen"] = cpu["loadgen"]
    s["router_cpu_share"] = cpu["gateway"] / (cpu["gateway"] + servers_cpu) if servers_cpu else math.nan
    s["lag_p99_ms"] = percentile([r["lag_ms"] for r in rows], 99)
    return s


def load_runs(directory: Path) -> dict[tuple[str, str, str], dict[int, dict[str, Any]]]:
    """(pool, engine, policy) -> seed -> summary."""
    runs: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for path in sorted(directory.glob("*-seed*.json")):
        output = json.loads(path.read_text())
        run = output["run"]
        summary = summarize(output)
        summary["run"] = run
        runs.setdefault((run["pool"], run["engine"], run["policy"]), {})[run["seed"]] = summary
    return runs


def _fmt(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def report(directory: Path) -> str:
    runs = load_runs(directory)
    lines: list[str] = []
    keys = [("ttft_p50", 0), ("ttft_p90", 0), ("ttft_p99", 0), ("tpot_p50", 1), ("tpot_p90", 1)]
    pools = sorted({k[0] for k in runs})
    for pool in pools:
        for engine in ("real", "sim"):
            policies = [k[2] for k in runs if k[0] == pool and k[1] == engine]
            if not policies:
                continue
            lines.append(f"\n{pool} pool, {engine} (per seed, then the median):\n")
            rows = []
            for policy in sorted(policies, key=_policy_order):
                seeds = runs[(pool, engine, policy)]
                row: list[object] = [policy, " / ".join(str(seed) for seed in sorted(seeds))]
                for key, digits in keys:
                    values = [seeds[seed][key] for seed in sorted(seeds)]
                    per_seed = " / ".join(_fmt(v, digits) for v in values)
                    row.append(
                        f"{per_seed} ({_fmt(_median(values), digits)})" if len(values) > 1 else per_seed
                    )
                row.append(" / ".join(str(seeds[seed]["errors"]) for seed in sorted(seeds)))
                row.append(" / ".join(str(seeds[seed]["requests"]) for seed in sorted(seeds)))
                row.append(_fmt(_median([seeds[s]["cached_share"] for s in seeds]) * 100) + " %")
                row.append(_fmt(_median([seeds[s]["system_hit_share"] for s in seeds]) * 100) + " %")
                rows.append(row)
            headers = ["policy", "seeds", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "TPOT p50 ms",
                       "TPOT p90 ms", "errors", "measured requests", "prompt tokens cached",
                       "system-prompt requests with a hit"]  # fmt: skip
            lines.append(markdown_table(headers, rows))
            lines.append("")
            for policy in sorted(policies, key=_policy_order):
                lines.append("- " + _notes(policy, runs[(pool, engine, policy)]))
    lines.append(
        "\nReal against sim: the real servers' seed-0 value (their median over seeds), then the sim's:\n"
    )
    rows = []
    compared = [("ttft_p50", 0), ("ttft_p90", 0), ("ttft_p99", 0), ("tpot_p50", 1), ("tpot_p90", 1),
                ("tpot_p99", 1), ("cached_share", 2), ("prompt_tokens_mean", 0)]  # fmt: skip
    for pool in pools:
        for policy in sorted({k[2] for k in runs if k[0] == pool}, key=_policy_order):
            real, sim = runs.get((pool, "real", policy), {}), runs.get((pool, "sim", policy), {})
            row = [pool, policy]
            for key, digits in compared:
                first = _fmt(real[min(real)][key], digits) if real else "–"
                middle = _fmt(_median([v[key] for v in real.values()]), digits) if real else "–"
                other = _fmt(sim[min(sim)][key], digits) if sim else "–"
                row.append(f"{first} ({middle}) / {other}")
            rows.append(row)
    headers = ["pool", "policy", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p90 ms",
               "TPOT p99 ms", "prompt tokens cached", "prompt tokens (engine's count)"]  # fmt: skip
    lines.append(markdown_table(headers, rows))
    lines.append("\nRatios to heuristic (medians over seeds), real against sim:\n")
    rows = []
    for pool in pools:
        for policy in ("token-aware", "predicted-latency"):
            row: list[object] = [pool, policy]
            for key, _ in keys[:4]:
                cells = []
                for engine in ("real", "sim"):
                    mine, base = runs.get((pool, engine, policy)), runs.get((pool, engine, "heuristic"))
                    if not mine or not base:
                        cells.append("–")
                        continue
                    ratio = _median([s[key] for s in mine.values()]) / _median(
                        [s[key] for s in base.values()]
                    )
                    cells.append(f"{ratio:.2f}×")
                row.append(" / ".join(cells))
            rows.append(row)
    lines.append(markdown_table(["pool", "policy", "TTFT p50 real / sim", "TTFT p90 real / sim",
                                 "TTFT p99 real / sim", "TPOT p50 real / sim"], rows))  # fmt: skip
    return "\n".join(lines)


def _notes(policy: str, seeds: dict[int, dict[str, Any]]) -> str:
    """What the table leaves out, per seed: requests per server, CPU, routes and prediction quality."""
    order = sorted(seeds)

    def each(key: str, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
        return " / ".join(_fmt(seeds[s].get(key, math.nan) * scale, digits) + unit for s in order)

    cores = " ; ".join(
        f"{seeds[s]['cpu_gateway']:.2f}/{seeds[s]['cpu_servers']:.2f}/{seeds[s]['cpu_loadgen']:.2f}"
        for s in order
    )
    parts = [
        f"{policy}: requests per server {[seeds[s]['requests_per_server'] for s in order]}",
        f"router CPU share {each('router_cpu_share', 100, 1, ' %')}",
        f"cores gateway/servers/loadgen {cores}",
        f"mean prompt tokens {each('prompt_tokens_mean', digits=0)}",
        "TTFT p90 by fifth of the run "
        + " ; ".join("/".join(f"{v:.0f}" for v in seeds[s]["ttft_p90_by_fifth"]) for s in order),
        "per server, slowest streams first, requests/TTFT p50/TPOT p50 "
        + " ; ".join(", ".join(f"{n}/{t:.0f}/{p:.1f}" for n, t, p in seeds[s]["servers"]) for s in order),
    ]
    if "ttft_coverage" in seeds[order[0]]:
        parts += [
            f"routed predicted {each('predicted_share', 100, 0, ' %')}",
            f"TTFT MAPE {each('ttft_mape')}, TPOT MAPE {each('tpot_mape')}",
            f"p90 coverage TTFT {each('ttft_coverage')}, TPOT {each('tpot_coverage')}",
            f"routes {[seeds[s]['routes'] for s in order]}",
        ]
    run = seeds[order[0]]["run"]
    parts.append(f"offered {run['rate']:.2f} req/s, {run['warmup_s']:g} s warm-up + {run['duration_s']:g} s")
    return "; ".join(parts)


def _policy_order(name: str) -> int:
    order = ["heuristic", "token-aware", "predicted-latency"]
    return order.index(name) if name in order else len(order)


def main() -> None:
    if run_as_loadgen(run_load):
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--pool", choices=sorted(POOLS), default="homogeneous")
    parser.add_argument("--sim", action="store_true", help="slorouter sim pods of the fitted profile instead")
    parser.add_argument(
        "--virtual",
        action="store_true",
        help="the fitted profile's pods in virtual time (slorouter bench's cluster), a table per pool",
    )
    parser.add_argument("--seeds", type=lambda t: [int(v) for v in t.split(",")], default=[0, 1, 2])
    parser.add_argument(
        "--policies", type=lambda t: t.split(","), default=["heuristic", "token-aware", "predicted-latency"]
    )
    parser.add_argument("--warmup", type=float, default=40.0, help="warm-up seconds (not measured)")
    parser.add_argument(
        "--max-extra-warmup",
        type=float,
        default=60.0,
        help="longest extension of the warm-up while the predictor's models are not served",
    )
    parser.add_argument("--duration", type=float, default=70.0, help="measured seconds")
    parser.add_argument(
        "--load", type=float, default=0.6, help="offered load, a share of the derived capacity"
    )
    parser.add_argument("--rate", type=float, default=None, help="requests/s (overrides --load)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "realengine", help="one JSON per run")
    parser.add_argument("--report", type=Path, metavar="DIR", help="print the tables of a results directory")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
    else:
        run_command(args)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
