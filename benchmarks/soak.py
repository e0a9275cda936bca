"""Soak and overload: the gateway with the predicted-latency pipeline for a long run while model servers
and the predictor are killed and restarted, or at twice the pool's capacity (docs/reliability.md).

Every process is real and on 127.0.0.1: one ``slorouter sim`` process per pod (so one pod can be SIGKILLed
and started again on its port), the predictor as sidecars (``slorouter predictor training-server`` and
``prediction-server``, remote mode, so the prediction server can be restarted without the router), the
gateway (``slorouter serve``) and a load generator in its own process (bench_quality_realtime.py's
workload: Poisson arrivals of streamed chat completions, half long-context; its capacity estimate: the pods'
engines driven in virtual time far above capacity).

Soak (default): ``--load-fraction`` (0.7) of the pool's capacity for ``--warmup`` + ``--duration`` seconds.
After the warm-up, every ``--fault-interval`` seconds one pod (in turn) is SIGKILLed and restarted
``--down`` seconds later; at mid-run the prediction server is SIGKILLed and restarted once. Every request
is recorded with the endpoint that served it (``x-slorouter-endpoint``); a failed request is *accounted*
when it was in flight on a pod at the moment that pod was killed (sent before the kill, failed after it).
The router's RSS and open file descriptors (/proc/PID) and its in-flight gauges (/metrics) are sampled
every ``--sample-interval`` seconds, ``/health`` and ``/metrics`` are probed by the load generator every
0.5 s. The run passes when no failure is unaccounted, RSS and fds grow by at most 10 % from the first
``--window`` after the warm-up to the last one, the in-flight gauges are 0 at the end and every probe was
answered.

Overload (``--overload``): no faults; ``--load-fraction`` of the capacity (0.5) for ``--baseline`` s, then
twice the capacity for ``--overload-s``, then 0.5 again for ``--recovery`` s. Half the requests carry the
objective ``batch`` (priority -1: sheddable, dropped with 429 by the SLO admitter when no pod is predicted
to meet their SLO); the gateway admits ``--max-concurrent`` requests at once (beyond it 503). It passes when
``/health`` and ``/metrics`` answered every probe, every non-200 is a 429 or a 503, the second half of the
recovery phase has no error and its TTFT p50 is within 1.5x of the baseline's, and the in-flight gauges
are 0 at the end.

Results: ``--out DIR`` gets ``soak.json`` (or ``overload.json``; summary, samples, faults, every request)
and ``soak.png`` (RSS, fds, in-flight and TTFT p50/p99 per window over time). Exit status 0 when it passes.

    .venv/bin/python benchmarks/soak.py [--duration 1800] [--warmup 120] [--pods 4] [--load-fraction 0.7]
        [--fault-interval 180] [--down 10] [--window 300] [--out DIR] [--short]
    .venv/bin/python benchmarks/soak.py --overload [--pods 2] [--baseline 60] [--overload-s 60]
        [--recovery 90] [--max-concurrent 48] [--out DIR] [--short]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from _harness import (
    SLOROUTER,
    free_port,
    free_port_range,
    gateway_config,
    markdown_table,
    start_logged,
    stop_process,
    wait_listening,
)
from _loadgen import OpenLoop, StreamResult, loadgen_argv, record_row, run_as_loadgen, stream_completion
from bench_quality_realtime import MODEL, Request, Workload, build_requests, pool_capacity

INFLIGHT = re.compile(r"^slorouter_inflight_(requests|prefill_tokens|decode_tokens)\{[^}]*\} (\S+)$", re.M)
SHED_OBJECTIVE = "batch"
GROWTH_LIMIT = 0.10
ACCOUNT_SLACK_S = 0.05  # the two processes' clocks are the same (CLOCK_MONOTONIC); this is event-loop lag


# --- processes ----------------------------------------------------------------------------------------------


class Child:
    """One process of the setup, its output to a log file; can be SIGKILLed and started again."""

    def __init__(self, name: str, args: list[str], port: int, log: Path) -> None:
        self.name, self.args, self.port, self.log = name, args, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self) -> None:
        self.proc = start_logged(self.args, self.log, append=True)

    def wait_listening(self, timeout: float = 60.0) -> None:
        wait_listening([self.port], self.log, self.name, timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> int | None:
        return None if self.proc is None else stop_process(self.proc, timeout=40)


@dataclass
class Setup:
    pods: list[Child]
    training: Child
    prediction: Child
    gateway: Child

    @property
    def children(self) -> list[Child]:
        return [*self.pods, self.training, self.prediction, self.gateway]

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"


def soak_gateway_config(
    port: int, endpoints: list[str], prediction_url: str, training_url: str, max_concurrent: int, seed: int
) -> dict[str, Any]:
    """The predicted-latency pipeline (streaming mode: TTFT and TPOT models) with a remote predictor."""
    config = gateway_config(port, endpoints, "predicted-latency", seed)
    config["gateway"]["max_concurrent_requests"] = max_concurrent
    config["predictor"] = {
        "mode": "remote",
        "prediction_by_default": True,
        "remote": {"training_server": training_url, "prediction_servers": [prediction_url]},
    }
    config["objectives"] = {SHED_OBJECTIVE: {"priority": -1}}
    return config


@contextlib.contextmanager
def running_setup(args: argparse.Namespace, tmp: Path) -> Iterator[Setup]:
    from slorouter.bench.pool import parse_pool

    profiles = parse_pool(f"{args.pods}x {args.profile}")
    sim_port = free_port_range(len(profiles))
    pods = []
    for i, profile in enumerate(profiles):
        port = sim_port + i
        cmd = [*SLOROUTER, "sim", "--pods", "1", "--port", str(port), "--profile", profile.name,
               "--model", MODEL, "--seed", str(args.seed + i)]  # fmt: skip
        pods.append(Child(f"pod{i}", cmd, port, tmp / f"pod{i}.log"))
    training_port, prediction_port, gateway_port = free_port(), free_port(), free_port()
    training_url = f"http://127.0.0.1:{training_port}"
    training = Child(
        "training-server",
        [*SLOROUTER, "predictor", "training-server", "--port", str(training_port),
         "--state-dir", str(tmp / "training-state"), "--train-threads", "1", "--log-level", "WARNING"],
        training_port, tmp / "training.log",
    )  # fmt: skip
    prediction = Child(
        "prediction-server",
        [*SLOROUTER, "predictor", "prediction-server", "--port", str(prediction_port),
         "--training-server", training_url, "--log-level", "WARNING"],
        prediction_port, tmp / "prediction.log",
    )  # fmt: skip
    config = soak_gateway_config(gateway_port, [f"127.0.0.1:{p.port}" for p in pods],
                                 f"http://127.0.0.1:{prediction_port}", training_url, args.max_concurrent,
                                 args.seed)  # fmt: skip
    config_path = tmp / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    gateway = Child(
        "gateway",
        [*SLOROUTER, "serve", "--config", str(config_path), "--log-level", "WARNING"],
        gateway_port,
        tmp / "gateway.log",
    )
    setup = Setup(pods, training, prediction, gateway)
    try:
        for child in [*pods, training, prediction]:
            child.spawn()
        for child in [*pods, training, prediction]:
            child.wait_listening()
        gateway.spawn()
        gateway.wait_listening()
        yield setup
    finally:
        for child in reversed(setup.children):
            child.stop()


# --- sampling the router ----------------------------------------------------------------------------------


def scrape(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as response:
        return str(response.read().decode())


def inflight_sums(metrics_text: str) -> dict[str, float]:
    sums = {"requests": 0.0, "prefill_tokens": 0.0, "decode_tokens": 0.0}
    for kind, value in INFLIGHT.findall(metrics_text):
        sums[kind] += float(value)
    return sums


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Sampler(threading.Thread):
    """The router's RSS, open fds and in-flight gauges every ``interval`` seconds, until stopped."""

    def __init__(self, pid: int, url: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.url, self.interval = pid, url, interval
        self.samples: list[dict[str, Any]] = []
        self.stopping = threading.Event()

    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {"t": time.monotonic(), "rss": rss_bytes(self.pid), "fds": open_fds(self.pid),
                               "loadavg": os.getloadavg()[0]}  # fmt: skip
        try:
            row["inflight"] = inflight_sums(scrape(self.url))
        except OSError as exc:
            row["scrape_error"] = f"{type(exc).__name__}: {exc}"
        self.samples.append(row)
        return row

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.sample()


# --- load generator (its own process) ---------------------------------------------------------------------


@dataclass
class Outcome:
    phase: str
    index: int
    kind: str
    objective: str
    sent: float  # CLOCK_MONOTONIC, shared with the orchestrating process
    answer: StreamResult = field(default_factory=StreamResult)


# What an outcome records of its answer, in this order (its end on CLOCK_MONOTONIC first).
ANSWER_FIELDS = ("end", "status", "ttft_ms", "e2e_ms", "completion_tokens", "endpoint", "route", "error")


@dataclass
class Probe:
    path: str
    t: float
    status: int = 0
    latency_ms: float = math.nan
    error: str = ""


async def _probe(session: Any, url: str, path: str, out: list[Probe]) -> None:
    probe = Probe(path, time.monotonic())
    out.append(probe)
    try:
        async with session.get(url + path, timeout=aiohttp.ClientTimeout(total=5)) as response:
            await response.read()
            probe.status = response.status
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        probe.error = f"{type(exc).__name__}: {exc}"
    probe.latency_ms = (time.monotonic() - probe.t) * 1e3


async def run_load(spec: dict[str, Any]) -> dict[str, Any]:
    workload = Workload(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["workload"].items()})
    base = spec["gateway"]
    url = f"{base}/v1/chat/completions"
    slo = {"chat": spec["slo_chat"], "long": spec["slo_long"]}
    outcomes: list[Outcome] = []
    probes: list[Probe] = []
    sender = OpenLoop(clock=time.monotonic)
    loop = sender.loop
    rng = np.random.default_rng(spec["seed"] + 99)

    def at(monotonic: float) -> float:  # a CLOCK_MONOTONIC time on the loop's clock
        return loop.time() + (monotonic - time.monotonic())

    timeout = aiohttp.ClientTimeout(total=spec["request_timeout_s"])
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session,
        aiohttp.ClientSession() as probe_session,  # its own connections: never queued behind the load
    ):
        done = asyncio.Event()

        async def probing() -> None:
            while not done.is_set():
                await asyncio.gather(_probe(probe_session, base, "/health", probes),
                                     _probe(probe_session, base, "/metrics", probes))  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), spec["probe_interval_s"])

        def begin(
            phase: str,
            index: int,
            request: Request,
            objective: str,
            headers: dict[str, str],
            sent: float,
            _: float,
        ) -> Coroutine[Any, Any, StreamResult]:
            out = Outcome(phase, index, request.kind, objective, sent)
            outcomes.append(out)
            return stream_completion(session, url, request.body, headers, sent, out.answer,
                                     clock=time.monotonic, error_events=True)  # fmt: skip

        prober = asyncio.create_task(probing())
        start = spec["start"]
        for p, phase in enumerate(spec["phases"]):
            requests = build_requests(spec["seed"] + 1_000 * p, phase["rate"], phase["duration_s"], workload)
            for i, request in enumerate(requests):
                due = at(start + request.offset_s)
                # Its objective and headers are decided before the wait: once due, it leaves at once.
                objective = SHED_OBJECTIVE if rng.random() < phase.get("sheddable_share", 0.0) else ""
                ttft, tpot = slo[request.kind]
                headers = {"Content-Type": "application/json", "x-slo-ttft-ms": f"{ttft:g}",
                           "x-slo-tpot-ms": f"{tpot:g}"}  # fmt: skip
                if objective:
                    headers["x-gateway-inference-objective"] = objective
                await sender.send(due, partial(begin, phase["name"], i, request, objective, headers))
            start += phase["duration_s"]
        await sender.drain(spec["request_timeout_s"] + 5)
        done.set()
        await prober
    return {
        "outcomes": [record_row(o, ANSWER_FIELDS) for o in outcomes],
        "probes": [asdict(p) for p in probes],
    }


# --- faults -----------------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str  # "pod" or "predictor"
    target: str  # the pod's address, or "prediction-server"
    killed: float  # CLOCK_MONOTONIC
    restarted: float = math.nan  # the process started again
    listening: float = math.nan  # its port accepts connections again


@dataclass
class Schedule:
    pod_kills: list[float] = field(default_factory=list)  # seconds after the load's start
    predictor_restart: float | None = None


def fault_schedule(warmup: float, duration: float, interval: float, down: float) -> Schedule:
    """A pod kill every ``interval`` s after the warm-up, each back before the next, none in the last
    ``interval`` s (as in the first one after the warm-up: the two quiet periods whose RSS and fds are
    compared), and the prediction server's restart at mid-run, away from the pod kills."""
    schedule = Schedule()
    end = warmup + duration
    t = warmup + interval
    while t + down + interval <= end:
        schedule.pod_kills.append(t)
        t += interval
    mid = warmup + duration / 2
    if any(abs(mid - k) < down + 2 for k in schedule.pod_kills):
        mid += interval / 2
    if mid + down < end:
        schedule.predictor_restart = mid
    return schedule


def play_faults(setup: Setup, schedule: Schedule, start: float, down: float) -> list[Fault]:
    """Runs the schedule (blocking); returns what was done, when."""
    events = [(t, "pod") for t in schedule.pod_kills]
    if schedule.predictor_restart is not None:
        events.append((schedule.predictor_restart, "predictor"))
    faults: list[Fault] = []
    pod_turn = 0
    for t, kind in sorted(events):
        delay = start + t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if kind == "pod":
            child = setup.pods[pod_turn % len(setup.pods)]
            pod_turn += 1
            target = f"127.0.0.1:{child.port}"
        else:
            child, target = setup.prediction, "prediction-server"
        child.kill()
        fault = Fault(kind, target, time.monotonic())
        faults.append(fault)
        print(f"  t={fault.killed - start:6.1f}s killed {target}", flush=True)
        time.sleep(down)
        child.spawn()
        fault.restarted = time.monotonic()
        child.wait_listening()
        fault.listening = time.monotonic()
    return faults


# --- analysis ---------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def account(
    outcomes: list[dict[str, Any]], faults: list[Fault]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(accounted, unaccounted) failures: accounted ones were in flight on a pod when it was killed."""
    accounted, unaccounted = [], []
    kills = [f for f in faults if f.kind == "pod"]
    for o in outcomes:
        if o["status"] == 200 and not o["error"]:
            continue
        match = next(
            (
                f
                for f in kills
                if o["endpoint"] == f.target
                and o["sent"] <= f.killed + ACCOUNT_SLACK_S
                and o["end"] >= f.killed - ACCOUNT_SLACK_S
            ),
            None,
        )
        row = {k: o[k] for k in ("phase", "index", "status", "endpoint", "error", "sent", "end")}
        if match is not None:
            row["killed"] = match.killed
            accounted.append(row)
        else:
            unaccounted.append(row)
    return accounted, unaccounted


def windows(outcomes: list[dict[str, Any]], start: float, end: float, width: float) -> list[dict[str, Any]]:
    """TTFT percentiles and counts of the requests sent in each ``width``-second window of [start, end)."""
    rows = []
    edges = np.arange(start, end - 1e-9, width)
    for left in edges:
        right = min(left + width, end)
        sent = [o for o in outcomes if left <= o["sent"] < right]
        ok = [o for o in sent if o["status"] == 200 and not o["error"] and not math.isnan(o["ttft_ms"])]
        ttft = [o["ttft_ms"] for o in ok]
        routes: dict[str, int] = {}
        for o in sent:
            routes[o["route"] or "-"] = routes.get(o["route"] or "-", 0) + 1
        statuses: dict[str, int] = {}
        for o in sent:
            key = str(o["status"]) if not o["error"] or o["status"] != 200 else "200-error"
            statuses[key] = statuses.get(key, 0) + 1
        rows.append({
            "from_s": round(left - start, 1), "to_s": round(right - start, 1), "sent": len(sent),
            "ok": len(ok), "failed": len(sent) - len(ok), "ttft_p50_ms": pct(ttft, 50),
            "ttft_p99_ms": pct(ttft, 99), "routes": routes, "statuses": statuses,
        })  # fmt: skip
    return rows


def probe_summary(
    probes: list[dict[str, Any]], start: float = -math.inf, end: float = math.inf
) -> dict[str, Any]:
    summary = {}
    for path in ("/health", "/metrics"):
        rows = [p for p in probes if p["path"] == path and start <= p["t"] < end]
        latencies = [p["latency_ms"] for p in rows]
        summary[path] = {
            "probes": len(rows),
            "failed": sum(p["status"] != 200 for p in rows),
            "p50_ms": pct(latencies, 50),
            "p99_ms": pct(latencies, 99),
            "max_ms": max(latencies, default=math.nan),
        }
    return summary


def growth(
    samples: list[dict[str, Any]], key: str, first: tuple[float, float], last: tuple[float, float]
) -> dict[str, Any]:
    """The median of ``key`` over the ``first`` and ``last`` time ranges, and the relative growth."""
    a = [s[key] for s in samples if first[0] <= s["t"] < first[1]]
    b = [s[key] for s in samples if last[0] <= s["t"] < last[1]]
    at_warmup, at_end = float(np.median(a)) if a else math.nan, float(np.median(b)) if b else math.nan
    after = [s[key] for s in samples if s["t"] >= first[0]]
    return {"after_warmup": at_warmup, "at_end": at_end, "growth": at_end / at_warmup - 1,
            "max_after_warmup": max(after, default=math.nan)}  # fmt: skip


def loadavg(samples: list[dict[str, Any]]) -> dict[str, float]:
    """The machine's 1-minute load average over the run (2 cores: above 2, processes wait for a CPU)."""
    values = [s["loadavg"] for s in samples if "loadavg" in s]
    return {"mean": float(np.mean(values)) if values else math.nan, "max": max(values, default=math.nan)}


def wait_inflight_zero(url: str, timeout: float = 15.0) -> dict[str, float]:
    """The in-flight sums once they are all 0 (or the last ones seen within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        sums = inflight_sums(scrape(url))
        if not any(sums.values()) or time.monotonic() > deadline:
            return sums
        time.sleep(0.5)


def log_problems(tmp: Path) -> dict[str, list[str]]:
    found = {}
    for log in sorted(tmp.glob("*.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if re.search(r"Traceback|ERROR|CRITICAL", line)]  # fmt: skip
        if lines:
            found[log.stem] = lines[-5:]
    return found


# --- runs -------------------------------------------------------------------------------------------------


def launch_load(setup: Setup, phases: list[dict[str, Any]], args: argparse.Namespace, tmp: Path,
                start: float) -> subprocess.Popen[bytes]:  # fmt: skip
    spec = {
        "gateway": setup.gateway_url, "phases": phases, "start": start, "seed": args.seed,
        "request_timeout_s": 120.0, "probe_interval_s": 0.5, "slo_chat": args.slo_chat,
        "slo_long": args.slo_long, "workload": asdict(Workload(long_share=args.long_share)),
    }  # fmt: skip
    (tmp / "spec.json").write_text(json.dumps(spec))
    return subprocess.Popen(loadgen_argv(__file__, tmp / "spec.json", tmp / "out.json"))


def run_soak(args: argparse.Namespace, rate: float, capacity: float, tmp: Path) -> dict[str, Any]:
    schedule = fault_schedule(args.warmup, args.duration, args.fault_interval, args.down)
    phases = [{"name": "warmup", "rate": rate, "duration_s": args.warmup},
              {"name": "measured", "rate": rate, "duration_s": args.duration}]  # fmt: skip
    with running_setup(args, tmp) as setup:
        sampler = Sampler(setup.gateway.pid, setup.gateway_url, args.sample_interval)
        idle_before = sampler.sample()
        sampler.start()
        start = time.monotonic() + 1.0
        loadgen = launch_load(setup, phases, args, tmp, start)
        faults = play_faults(setup, schedule, start, args.down)
        if loadgen.wait() != 0:
            raise SystemExit(f"the load generator failed ({loadgen.returncode})")
        sampler.stopping.set()
        sampler.join()
        final_inflight = wait_inflight_zero(setup.gateway_url)
        time.sleep(args.settle)  # the kept-alive upstream connections close after 30 s idle
        idle_after = sampler.sample()
        gateway_exit = setup.gateway.stop()
    output = json.loads((tmp / "out.json").read_text())
    outcomes, probes = output["outcomes"], output["probes"]
    measured_start, end = start + args.warmup, start + args.warmup + args.duration
    accounted, unaccounted = account(outcomes, faults)
    baseline_window = min(args.window, args.fault_interval / 2)
    samples = sampler.samples
    rss = growth(
        samples, "rss", (measured_start, measured_start + baseline_window), (end - baseline_window, end)
    )
    fds = growth(
        samples, "fds", (measured_start, measured_start + baseline_window), (end - baseline_window, end)
    )
    ok = [o for o in outcomes if o["status"] == 200 and not o["error"]]
    probes_all = probe_summary(probes)
    summary = {
        "mode": "soak", "pods": args.pods, "profile": args.profile, "capacity_req_s": capacity,
        "rate_req_s": rate, "warmup_s": args.warmup, "duration_s": args.duration,
        "fault_interval_s": args.fault_interval, "down_s": args.down, "window_s": args.window,
        "sent": len(outcomes), "completed": len(ok), "failed": len(outcomes) - len(ok),
        "failed_accounted": len(accounted), "failed_unaccounted": len(unaccounted),
        "pod_kills": sum(f.kind == "pod" for f in faults),
        "predictor_restarts": sum(f.kind == "predictor" for f in faults),
        "rss_bytes": rss, "fds": fds,
        "idle_before": {"rss": idle_before["rss"], "fds": idle_before["fds"]},
        "idle_after": {"rss": idle_after["rss"], "fds": idle_after["fds"], "settle_s": args.settle},
        "inflight_at_end": final_inflight,
        "loadavg": loadavg(samples),
        "probes": probes_all,
        "windows": windows(outcomes, measured_start, end, args.window),
        "gateway_exit": gateway_exit, "log_problems": log_problems(tmp),
    }  # fmt: skip
    checks = {
        "no_unaccounted_failures": not unaccounted,
        "rss_growth_within_10pct": rss["growth"] <= GROWTH_LIMIT,
        "fd_growth_within_10pct": fds["growth"] <= GROWTH_LIMIT,
        "inflight_zero_at_end": not any(final_inflight.values()),
        "probes_all_answered": all(v["failed"] == 0 and v["probes"] > 0 for v in probes_all.values()),
    }
    summary["checks"] = checks
    summary["passed"] = all(checks.values())
    return {
        "summary": summary, "start": start, "samples": samples, "faults": [asdict(f) for f in faults],
        "accounted": accounted, "unaccounted": unaccounted, "outcomes": outcomes, "probes": probes,
    }  # fmt: skip


def run_overload(args: argparse.Namespace, rate: float, capacity: float, tmp: Path) -> dict[str, Any]:
    share = args.sheddable_share
    phases = [
        {"name": "baseline", "rate": rate, "duration_s": args.baseline, "sheddable_share": share},
        {"name": "overload", "rate": 2 * capacity, "duration_s": args.overload_s, "sheddable_share": share},
        {"name": "recovery", "rate": rate, "duration_s": args.recovery, "sheddable_share": share},
    ]
    with running_setup(args, tmp) as setup:
        sampler = Sampler(setup.gateway.pid, setup.gateway_url, args.sample_interval)
        sampler.sample()
        sampler.start()
        start = time.monotonic() + 1.0
        loadgen = launch_load(setup, phases, args, tmp, start)
        if loadgen.wait() != 0:
            raise SystemExit(f"the load generator failed ({loadgen.returncode})")
        sampler.stopping.set()
        sampler.join()
        final_inflight = wait_inflight_zero(setup.gateway_url)
        gateway_exit = setup.gateway.stop()
    output = json.loads((tmp / "out.json").read_text())
    outcomes, probes = output["outcomes"], output["probes"]
    per_phase: dict[str, Any] = {}
    t = start
    for phase in phases:
        rows = [o for o in outcomes if o["phase"] == phase["name"]]
        ok = [o for o in rows if o["status"] == 200 and not o["error"]]
        statuses: dict[str, int] = {}
        for o in rows:
            key = str(o["status"]) if o["status"] != 200 or not o["error"] else "200-error"
            key += "-sheddable" if o["objective"] else ""
            statuses[key] = statuses.get(key, 0) + 1
        ttft = [o["ttft_ms"] for o in ok if not math.isnan(o["ttft_ms"])]
        second_half = [o for o in rows if o["sent"] >= t + phase["duration_s"] / 2]
        ok_half = [o for o in second_half if o["status"] == 200 and not o["error"]]
        per_phase[phase["name"]] = {
            "rate_req_s": phase["rate"], "duration_s": phase["duration_s"], "sent": len(rows),
            "ok": len(ok), "statuses": statuses, "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "second_half_errors": len(second_half) - len(ok_half),
            "second_half_ttft_p50_ms": pct([o["ttft_ms"] for o in ok_half], 50),
            "probes": probe_summary(probes, t, t + phase["duration_s"]),
        }  # fmt: skip
        t += phase["duration_s"]
    unexpected = [
        o for o in outcomes if not (o["status"] == 200 and not o["error"]) and o["status"] not in (429, 503)
    ]
    base, rec = per_phase["baseline"], per_phase["recovery"]
    probes_all = probe_summary(probes)
    checks = {
        "probes_all_answered": all(v["failed"] == 0 and v["probes"] > 0 for v in probes_all.values()),
        "only_429_or_503_errors": not unexpected,
        "recovered_no_errors": rec["second_half_errors"] == 0,
        "recovered_ttft": rec["second_half_ttft_p50_ms"] <= 1.5 * base["ttft_p50_ms"],
        "inflight_zero_at_end": not any(final_inflight.values()),
    }
    summary = {
        "mode": "overload", "pods": args.pods, "profile": args.profile, "capacity_req_s": capacity,
        "max_concurrent_requests": args.max_concurrent, "sheddable_share": share, "phases": per_phase,
        "probes": probes_all, "unexpected_errors": len(unexpected), "inflight_at_end": final_inflight,
        "windows": windows(outcomes, start, t, args.window), "gateway_exit": gateway_exit,
        "log_problems": log_problems(tmp), "checks": checks, "passed": all(checks.values()),
    }  # fmt: skip
    return {"summary": summary, "start": start, "samples": sampler.samples, "unexpected": unexpected[:50],
            "outcomes": outcomes, "probes": probes}  # fmt: skip


# --- report -----------------------------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = result["start"]
    samples = result["samples"]
    t = [(s["t"] - start) / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    axes[0].plot(t, [s["rss"] / 2**20 for s in samples])
    axes[0].set_ylabel("router RSS MiB")
    axes[1].plot(t, [s["fds"] for s in samples])
    axes[1].set_ylabel("open fds")
    axes[2].plot(t, [s.get("inflight", {}).get("requests", math.nan) for s in samples])
    axes[2].set_ylabel("in-flight requests")
    rows = result["summary"]["windows"]
    offset = result["summary"].get("warmup_s", 0.0)
    mids = [((r["from_s"] + r["to_s"]) / 2 + offset) / 60 for r in rows]
    axes[3].plot(mids, [r["ttft_p50_ms"] for r in rows], "o-", label="TTFT p50")
    axes[3].plot(mids, [r["ttft_p99_ms"] for r in rows], "s-", label="TTFT p99")
    axes[3].set_ylabel("ms (per window)")
    axes[3].set_yscale("log")
    axes[3].legend()
    for fault in result.get("faults", []):
        for ax in axes:
            ax.axvline((fault["killed"] - start) / 60, color="red" if fault["kind"] == "pod" else "purple",
                       alpha=0.3, lw=1)  # fmt: skip
    axes[3].set_xlabel("minutes since the load started (red: pod killed, purple: prediction server killed)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def report(summary: dict[str, Any]) -> str:
    lines = []
    if summary["mode"] == "soak":
        s = summary
        lines.append(f"sent {s['sent']}, completed {s['completed']}, failed {s['failed']} "
                     f"(accounted {s['failed_accounted']}, unaccounted {s['failed_unaccounted']}); "
                     f"{s['pod_kills']} pod kills, "
                     f"{s['predictor_restarts']} prediction-server restarts")  # fmt: skip
        for key, unit, scale in (("rss_bytes", "MiB", 2**20), ("fds", "", 1)):
            g = s[key]
            lines.append(f"{key}: {g['after_warmup'] / scale:.1f}{unit} after warm-up, "
                         f"{g['at_end'] / scale:.1f}{unit} at the end ({g['growth']:+.1%}), "
                         f"max {g['max_after_warmup'] / scale:.1f}{unit}")  # fmt: skip
        lines.append(f"idle before {s['idle_before']}, idle after {s['idle_after']}")
    else:
        headers = ["phase", "rate req/s", "sent", "ok", "statuses", "TTFT p50", "TTFT p99", "2nd-half errors",
                   "2nd-half TTFT p50", "/health max ms", "/metrics max ms"]  # fmt: skip
        rows = [[name, f"{p['rate_req_s']:.1f}", p["sent"], p["ok"], p["statuses"], f"{p['ttft_p50_ms']:.0f}",
                 f"{p['ttft_p99_ms']:.0f}", p["second_half_errors"], f"{p['second_half_ttft_p50_ms']:.0f}",
                 f"{p['probes']['/health']['max_ms']:.0f}", f"{p['probes']['/metrics']['max_ms']:.0f}"]
                for name, p in summary["phases"].items()]  # fmt: skip
        lines += [markdown_table(headers, rows), ""]
    headers = ["window s", "sent", "failed", "TTFT p50 ms", "TTFT p99 ms", "routes"]
    rows = [[f"{w['from_s']:g}-{w['to_s']:g}", w["sent"], w["failed"], f"{w['ttft_p50_ms']:.0f}",
             f"{w['ttft_p99_ms']:.0f}", w["routes"]] for w in summary["windows"]]  # fmt: skip
    lines += [markdown_table(headers, rows), ""]
    lines.append(f"probes: {summary['probes']}")
    lines.append(
        f"in-flight at the end: {summary['inflight_at_end']}; gateway exit {summary['gateway_exit']}"
    )
    if summary["log_problems"]:
        lines.append(f"log problems: {summary['log_problems']}")
    lines.append(f"checks: {summary['checks']} -> {'PASSED' if summary['passed'] else 'FAILED'}")
    return "\n".join(lines)


def main() -> None:
    if run_as_loadgen(run_load):
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--overload", action="store_true", help="the overload run instead of the soak")
    parser.add_argument("--short", action="store_true", help="CI-sized durations (every default shortened)")
    parser.add_argument(
        "--duration", type=float, default=None, help="soak: measured seconds (1800; short 30)"
    )
    parser.add_argument("--warmup", type=float, default=None, help="soak: warm-up seconds (120; short 10)")
    parser.add_argument(
        "--fault-interval", type=float, default=None, help="soak: s between pod kills (180; 8)"
    )
    parser.add_argument(
        "--down", type=float, default=None, help="soak: s a killed process stays down (10; 2)"
    )
    parser.add_argument("--window", type=float, default=None, help="TTFT window s (300; short 10)")
    parser.add_argument("--sample-interval", type=float, default=None, help="s between RSS/fd samples (5; 1)")
    parser.add_argument("--settle", type=float, default=None,
                        help="soak: s idle after the load before the last sample (35; short 0)")  # fmt: skip
    parser.add_argument("--baseline", type=float, default=None, help="overload: s at --load-fraction (60; 8)")
    parser.add_argument("--overload-s", type=float, default=None, help="overload: s at 2x capacity (60; 10)")
    parser.add_argument(
        "--recovery", type=float, default=None, help="overload: s back at the fraction (90; 14)"
    )
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="gateway.max_concurrent_requests (soak 4096; overload 24 per pod)")  # fmt: skip
    parser.add_argument(
        "--sheddable-share", type=float, default=0.5, help="overload: share of sheddable requests"
    )
    parser.add_argument("--pods", type=int, default=None, help="pods (soak 4, overload 2)")
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument(
        "--load-fraction", type=float, default=None, help="share of capacity (soak 0.7, overload 0.5)"
    )
    parser.add_argument("--long-share", type=float, default=0.5)
    parser.add_argument("--slo-chat", type=float, nargs=2, default=(200.0, 25.0), metavar=("TTFT", "TPOT"))
    parser.add_argument("--slo-long", type=float, nargs=2, default=(600.0, 35.0), metavar=("TTFT", "TPOT"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON results and the plot")
    args = parser.parse_args()
    short = args.short
    defaults = {
        "duration": 30.0 if short else 1800.0, "warmup": 10.0 if short else 120.0,
        "fault_interval": 8.0 if short else 180.0, "down": 2.0 if short else 10.0,
        "window": 10.0 if short else (300.0 if not args.overload else 15.0),
        "sample_interval": 1.0 if short else 5.0, "settle": 0.0 if short else 35.0,
        "baseline": 8.0 if short else 60.0,
        "overload_s": 10.0 if short else 60.0, "recovery": 14.0 if short else 90.0,
        "pods": 2 if args.overload or short else 4, "load_fraction": 0.5 if args.overload else 0.7,
    }  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.max_concurrent is None:
        args.max_concurrent = 24 * args.pods if args.overload else 4096
    for key in ("duration", "warmup", "fault_interval", "window", "sample_interval", "baseline", "overload_s",
                "recovery"):  # fmt: skip
        if not getattr(args, key) > 0:
            parser.error(f"--{key.replace('_', '-')} must be > 0, got {getattr(args, key)}")
    if args.down < 0 or args.down >= args.fault_interval:
        parser.error(f"--down must be >= 0 and < --fault-interval, got {args.down}")
    if args.pods < 1 or args.max_concurrent < 1:
        parser.error("--pods and --max-concurrent must be >= 1")
    if not 0 < args.load_fraction <= 1 or not 0 <= args.sheddable_share <= 1:
        parser.error("--load-fraction must be in (0, 1] and --sheddable-share in [0, 1]")
    from slorouter.bench.pool import parse_pool

    try:
        profiles = parse_pool(f"{args.pods}x {args.profile}")
    except ValueError as exc:
        parser.error(f"--profile: {exc}")
    started = time.monotonic()
    capacity = pool_capacity(profiles, Workload(long_share=args.long_share), 0)
    rate = args.load_fraction * capacity
    mode = "overload" if args.overload else "soak"
    print(f"{mode}: {args.pods}x {args.profile}, capacity {capacity:.1f} req/s (engines in virtual time), "
          f"offered {rate:.1f} req/s" + (f", overload {2 * capacity:.1f} req/s" if args.overload else ""),
          flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f"slorouter-{mode}-") as tmp:
        run = run_overload if args.overload else run_soak
        result = run(args, rate, capacity, Path(tmp))
        if args.out:  # the processes' logs, to read what went wrong
            (args.out / "logs").mkdir(parents=True, exist_ok=True)
            for log in Path(tmp).glob("*.log"):
                shutil.copy(log, args.out / "logs" / log.name)
    result["summary"]["command"] = f".venv/bin/python benchmarks/soak.py {shlex.join(sys.argv[1:])}"
    result["summary"]["wall_s"] = round(time.monotonic() - started, 1)
    print(report(result["summary"]), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{mode}.json").write_text(json.dumps(result, default=str))
        plot(result, args.out / f"{mode}.png", f"{mode}: {args.pods}x {args.profile}, {rate:.1f} req/s")
    sys.exit(0 if result["summary"]["passed"] else 1)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
