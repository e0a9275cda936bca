"""Prediction-server benchmarks: one server process's bulk throughput, and client→server latency.

Models: TTFT and TPOT, 200 trees, depth 6, p90 quantile (the trainer's defaults), trained on simulator samples
and written to a temporary model directory, from which one ``slorouter predictor prediction-server``
process serves them (pinned to one CPU with ``taskset`` when there are at least two).

1. Throughput: wrk (C, another process, pinned to the other CPUs) posts ``POST /v1/predict/bulk`` with 100
   rows, from several connections, in both request formats: the JSON rows of the contract and the optional
   binary float32 body; requests/s, wrk's latency percentiles, and the server's CPU time per request (from
   /proc: what the server itself spent, whatever else ran on its CPU). Target: ≥ 1,500 requests/s.
2. Compute floor: the bulk handler's work without HTTP (parse, build the matrices, predict both models,
   serialise), timed in this process for both formats: the most one process could serve on this CPU.
3. End to end: in this process, ``PredictionClient`` (1 ms coalescing window, 50 ms timeout; binary wire
   format, its default, and JSON) with concurrent router-like callers, each predicting 100 candidates per
   call at a fixed call rate (Poisson arrivals); p50/p99 of the ``predict`` call as the router sees it
   (window + encoding + HTTP + server + decoding).

    .venv/bin/python benchmarks/bench_prediction_server.py [--seconds 10] [--connections 8 32] \
        [--rates 50 100 200] [--rounds 3] [--formats json binary]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

import numpy as np
import uvloop

from _harness import ensure_wrk, free_port, logged_process, markdown_table, wrk_duration_ms
from slorouter.bench.samples import SimSamples, generate_samples
from slorouter.clock import ManualClock
from slorouter.http.json_bodies import parse_json
from slorouter.predictor.backend import PredictionUnavailable
from slorouter.predictor.features import columns_to_union_matrix
from slorouter.predictor.model_sources import make_source
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.prediction_client import PredictionClient
from slorouter.predictor.prediction_server import PredictionServer
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer, TrainerConfig
from slorouter.predictor.wire import RowEncoder, encode_predictions

ROWS = 100
SERVER = [sys.executable, "-m", "slorouter.predictor.command", "prediction-server"]


def train(model_dir: str, samples: SimSamples) -> None:
    store = SampleStore()
    for kind in ("ttft", "tpot"):
        store.add(kind, *samples.dataset(kind))
    trainer = Trainer(store, ModelStore(model_dir), TrainerConfig(), ManualClock())
    reports = trainer.maybe_train()
    assert {r.kind for r in reports if r.accepted} == {"ttft", "tpot"}, reports


def candidate_sets(samples: SimSamples, count: int, seed: int) -> list[np.ndarray]:
    """``count`` union matrices of ROWS candidate endpoints each (one request's input and output length per
    set)."""
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(count):
        pick = rng.integers(0, len(samples), ROWS)
        columns: dict[str, np.ndarray | float] = {
            name: values[pick] for name, values in samples.columns.items()
        }
        columns["input_token_length"] = float(samples.columns["input_token_length"][pick[0]])
        columns["num_tokens_generated"] = float(samples.columns["num_tokens_generated"][pick[0]])
        sets.append(columns_to_union_matrix(columns))
    return sets


def pin() -> list[str]:
    """Keep CPU 0 for the server (returns its ``taskset`` prefix); this process and wrk use the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return []
    os.sched_setaffinity(0, cpus[1:])
    return ["taskset", "-c", str(cpus[0])]


async def end_to_end(url: str, sets: list[np.ndarray], rate: float, seconds: float, binary: bool) -> dict:
    client = PredictionClient([url], coalesce_window_s=0.001, timeout_s=0.05, binary=binary)
    client.start()
    await asyncio.sleep(0.2)  # first health probe
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    unavailable = 0
    rng = np.random.default_rng(1)

    async def call(x_all: np.ndarray) -> None:
        nonlocal unavailable
        started = time.perf_counter()
        try:
            await client.predict(x_all)
        except PredictionUnavailable:
            unavailable += 1
            return
        latencies.append(time.perf_counter() - started)

    tasks = []
    deadline = loop.time() + seconds
    next_at = loop.time()
    i = 0
    while next_at < deadline:
        delay = next_at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(call(sets[i % len(sets)])))
        i += 1
        next_at += rng.exponential(1.0 / rate)
    await asyncio.gather(*tasks)
    bulk = client.stats.bulk_requests
    await client.stop()
    ms = np.array(latencies) * 1000.0
    return {
        "calls": i,
        "p50": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        "p99": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        "unavailable": unavailable,
        "rows_per_bulk": i * ROWS / max(1, bulk),
    }


def handler_floor(
    model_dir: str,
    wire: RowEncoder,
    x_candidates: np.ndarray,
    binary: bool,
    iterations: int = 2000,
) -> dict[str, float]:
    """Median µs of each step of the bulk handler, in-process (no HTTP)."""
    server = PredictionServer(make_source(model_dir=model_dir))
    server.predictor.refresh()
    names = ",".join(wire.names).encode()
    body = wire.encode_binary(x_candidates) if binary else wire.encode(x_candidates)
    steps = np.empty((iterations, 4))
    perf = time.perf_counter
    for i in range(iterations + 200):
        t0 = perf()
        if binary:
            x_all = server._binary_rows(body, names, 10_000)
            t1 = t2 = perf()
        else:
            rows = server._rows(parse_json(body))
            t1 = perf()
            result = server._json_rows(rows)
            assert result is not None
            x_all = result
            t2 = perf()
        ttft, tpot = server.predictor.predict_all(x_all)
        t3 = perf()
        if binary:
            server._encode_binary(ttft, tpot)
        else:
            encode_predictions(ttft, tpot, server.model_versions)
        t4 = perf()
        if i >= 200:
            steps[i - 200] = (t1 - t0, t2 - t1, t3 - t2, t4 - t3)
    median = np.median(steps, axis=0) * 1e6
    return dict(zip(("parse", "matrices", "predict", "encode"), median.tolist(), strict=True))


def run_wrk(
    url: str, body: bytes, headers: dict[str, str], *, connections: int, seconds: float, server_pid: int
) -> dict[str, float]:
    """POST ``body`` (any bytes: wrk reads it from a file) with wrk; req/s, latency percentiles in ms, and
    the server process's CPU µs per request."""
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as directory:
        body_path = os.path.join(directory, "body")
        with open(body_path, "wb") as f:
            f.write(body)
        script_path = os.path.join(directory, "post.lua")
        lines = [
            'wrk.method = "POST"',
            f'local f = io.open("{body_path}", "rb")',
            "wrk.body = f:read('*all')",
        ]
        lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
        with open(script_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        cpu_before = cpu_ticks(server_pid)
        out = subprocess.run(
            [
                ensure_wrk(),
                "-t1",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                "--latency",
                "-s",
                script_path,
                url,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        cpu = (cpu_ticks(server_pid) - cpu_before) / os.sysconf("SC_CLK_TCK")
    result = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))}
    result["requests"] = float(re.search(r"(\d+) requests in", out).group(1))
    for pct in ("50", "99"):
        result[f"p{pct}_ms"] = wrk_duration_ms(re.search(rf"\s{pct}%\s+(\S+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non_2xx"] = float(errors.group(1)) if errors else 0.0
    result["cpu_us"] = cpu * 1e6 / max(1.0, result["requests"])
    return result


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def calibration_us() -> float:
    """µs of ``sum(range(10000))`` (best of 5): how fast this CPU runs Python right now."""
    return min(timeit.repeat("sum(range(10000))", number=200, repeat=5)) / 200 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rates", type=float, nargs="+", default=[50.0, 100.0, 200.0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--formats", nargs="+", choices=["json", "binary"], default=["json", "binary"])
    parser.add_argument("--train-samples", type=int, default=4000)
    args = parser.parse_args()

    samples = generate_samples(args.train_samples, seed=0)
    server_cpu = pin()
    wire = RowEncoder()
    bodies = {"json": wire.encode, "binary": wire.encode_binary}
    with tempfile.TemporaryDirectory(prefix="bench-prediction-server-") as model_dir:
        train(model_dir, samples)
        sets = candidate_sets(samples, 64, seed=2)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = [
            *server_cpu,
            *SERVER,
            "--model-dir",
            model_dir,
            "--port",
            str(port),
            "--log-level",
            "WARNING",
        ]
        floors = {fmt: handler_floor(model_dir, wire, sets[0], fmt == "binary") for fmt in args.formats}
        throughput: dict[tuple[str, int], list[dict[str, float]]] = {
            (fmt, c): [] for fmt in args.formats for c in args.connections
        }
        e2e: dict[tuple[str, float], dict] = {}
        with logged_process(server, [port]) as proc:
            wait_ready(url)
            target = url + "/v1/predict/bulk"
            for fmt in args.formats:  # warm-up
                body = bodies[fmt](sets[0])
                run_wrk(
                    target, body, wire.headers(fmt == "binary"), connections=8, seconds=2, server_pid=proc.pid
                )
            for _ in range(args.rounds):
                for fmt in args.formats:
                    body = bodies[fmt](sets[0])
                    for connections in args.connections:
                        result = run_wrk(
                            target,
                            body,
                            wire.headers(fmt == "binary"),
                            connections=connections,
                            seconds=args.seconds,
                            server_pid=proc.pid,
                        )
                        throughput[(fmt, connections)].append(result)
            for fmt in args.formats:
                for rate in args.rates:
                    e2e[(fmt, rate)] = uvloop.run(end_to_end(url, sets, rate, args.seconds, fmt == "binary"))

    pinned = f"server pinned to CPU {server_cpu[-1]}" if server_cpu else "server not pinned"
    calibration = f"sum(range(10000)) = {calibration_us():.0f} µs, load average {os.getloadavg()[0]:.1f}"
    print(
        f"\nPrediction server, bulk of {ROWS} rows, 200-tree depth-6 TTFT+TPOT models, {pinned}; "
        f"median of {args.rounds} rounds of {args.seconds:g} s ({calibration})\n"
    )
    rows = [
        [
            fmt,
            connections,
            f"{statistics.median(r['rps'] for r in runs):,.0f}",
            f"{statistics.median(r['p50_ms'] for r in runs):.2f}",
            f"{statistics.median(r['p99_ms'] for r in runs):.2f}",
            f"{statistics.median(r['cpu_us'] for r in runs):.0f}",
            int(sum(r["non_2xx"] for r in runs)),
        ]
        for (fmt, connections), runs in throughput.items()
    ]
    headers = [
        "format",
        "wrk connections",
        "requests/s",
        "p50 ms",
        "p99 ms",
        "server CPU µs/request",
        "non-2xx",
    ]
    print(markdown_table(headers, rows))

    print(f"\nBulk handler without HTTP, in-process, median µs per {ROWS}-row request\n")
    headers = [
        "format",
        "parse",
        "build matrices",
        "predict (2 models)",
        "serialise",
        "total",
        "max requests/s",
    ]
    cells = []
    for fmt, floor in floors.items():
        total = sum(floor.values())
        cells.append([fmt, *(f"{v:.0f}" for v in floor.values()), f"{total:.0f}", f"{1e6 / total:,.0f}"])
    print(markdown_table(headers, cells))

    print(
        f"\nClient → server: PredictionClient (1 ms window, 50 ms timeout), {ROWS} candidates per call, "
        f"Poisson arrivals, {args.seconds:g} s per rate\n"
    )
    rows = [
        [
            fmt,
            f"{rate:g}",
            r["calls"],
            f"{r['rows_per_bulk']:.0f}",
            f"{r['p50']:.2f}",
            f"{r['p99']:.2f}",
            r["unavailable"],
        ]
        for (fmt, rate), r in e2e.items()
    ]
    headers = ["wire format", "calls/s", "calls", "rows per bulk", "p50 ms", "p99 ms", "unavailable"]
    print(markdown_table(headers, rows))


def wait_ready(url: str, timeout: float = 60.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/status", timeout=5) as response:
                status = json.loads(response.read())
            if all(status["model_versions"].get(k) for k in ("ttft", "tpot")):
                return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not load both models within {timeout}s")


if __name__ == "__main__":
    main()
