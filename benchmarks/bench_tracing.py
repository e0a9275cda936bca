"""Tracing overhead: the same gateway with tracing off, and on (every request sampled, and the default 10 %)
exporting over OTLP/gRPC to a receiver (the collector's TraceService, tests/helpers/otlp_receiver.py, in its
own process), side by side in one run.

Two shapes, each in rounds that alternate the three gateways (medians of the rounds):

- **one-token** requests (`slorouter sim --profile instant`: no model cost) with wrk, 1 connection (added
  latency) and 64 connections (throughput): the worst case for a per-request cost;
- **streamed** chat completions of `--output-tokens` tokens on `llama3-8b-h100` pods at `--stream-rate`
  requests/s (benchmarks/_stream_load.py, its own process): the shape users send.

The CPU columns are the gateway's user+system time per request (from /proc); they barely depend on what else
runs on the machine, so they show what tracing costs the gateway itself. The receiver's span count checks
that the spans were exported (three per sampled request).

    .venv/bin/python benchmarks/bench_tracing.py [--rounds 3] [--seconds 8] [--stream-seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from _harness import (
    ROOT,
    SLOROUTER,
    cpu_seconds,
    free_port,
    free_port_range,
    logged_process,
    markdown_table,
    run_wrk,
)
from _stream_load import stream_load

BODY = '{"model": "sim-instant", "prompt": "Hello, how are you?", "max_tokens": 1}'
SETUPS = {"off": None, "on, 100 % sampled": 1.0, "on, 10 % sampled": 0.1}


def gateway_yaml(port: int, endpoints: list[str], receiver: str, ratio: float | None) -> str:
    tracing = (
        "tracing: {enabled: false}\n"
        if ratio is None
        else f"tracing: {{enabled: true, otelExporterEndpoint: '{receiver}', "
        f"sampling: {{samplerArg: {ratio}}}}}\n"
    )
    return f"gateway: {{host: 127.0.0.1, port: {port}}}\npool: {{endpoints: {endpoints}}}\n" + tracing


def start_gateways(
    stack: ExitStack, directory: Path, endpoints: list[str], receiver: str, tag: str
) -> dict[str, tuple[str, int]]:
    """name -> (base URL, pid), one `slorouter serve` per setup."""
    gateways = {}
    for name, ratio in SETUPS.items():
        port = free_port()
        config = directory / f"{tag}-{port}.yaml"
        config.write_text(gateway_yaml(port, endpoints, receiver, ratio))
        proc = stack.enter_context(
            logged_process([*SLOROUTER, "serve", "--config", str(config), "--log-level", "WARNING"], [port])
        )
        gateways[name] = (f"http://127.0.0.1:{port}", proc.pid)
    return gateways


def one_token(args: argparse.Namespace, receiver: str, directory: Path) -> list[list[str]]:
    sim_port = free_port()
    endpoints = [f"127.0.0.1:{sim_port}"]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with ExitStack() as stack:
        sim = [*SLOROUTER, "sim", "--port", str(sim_port), "--profile", "instant", "--model", "sim-instant"]
        stack.enter_context(logged_process(sim, [sim_port]))
        gateways = start_gateways(stack, directory, endpoints, receiver, "one-token")
        for url, _ in gateways.values():
            run_wrk(f"{url}/v1/completions", BODY, connections=8, seconds=1)
        for round_index in range(args.rounds):
            for name, (url, pid) in gateways.items():
                for conns in (1, 64):
                    print(
                        f"one-token round {round_index + 1}: {name}, {conns} conn.",
                        file=sys.stderr,
                        flush=True,
                    )
                    before = cpu_seconds(pid)
                    r = run_wrk(f"{url}/v1/completions", BODY, connections=conns, seconds=args.seconds)
                    r["cpu_ms"] = (cpu_seconds(pid) - before) * 1e3 / max(r["requests"], 1.0)
                    results.setdefault((name, conns), []).append(r)

    def med(name: str, conns: int, key: str) -> float:
        return statistics.median(r[key] for r in results[(name, conns)])

    rows = []
    base = "off"
    for name in SETUPS:
        errors = sum(r["non_2xx"] for conns in (1, 64) for r in results[(name, conns)])
        rows.append([
            name,
            f"{med(name, 64, 'rps'):,.0f}", f"{med(name, 64, 'rps') / med(base, 64, 'rps'):.2f}",
            f"{med(name, 1, 'p50_ms'):.3f}", f"{med(name, 1, 'p50_ms') - med(base, 1, 'p50_ms'):+.3f}",
            f"{med(name, 64, 'cpu_ms'):.3f}", f"{med(name, 64, 'cpu_ms') - med(base, 64, 'cpu_ms'):+.3f}",
            f"{errors:.0f}",
        ])  # fmt: skip
    return rows


def run_load(url: str, args: argparse.Namespace, seconds: float, directory: Path) -> dict:
    return stream_load(url, rate=args.stream_rate, seconds=seconds, prompt_tokens=args.prompt_tokens,
                       max_tokens=args.output_tokens, directory=directory)  # fmt: skip


def streamed(args: argparse.Namespace, receiver: str, directory: Path) -> list[list[str]]:
    pods = args.stream_pods
    sim_port = free_port_range(pods)
    endpoints = [f"127.0.0.1:{sim_port + i}" for i in range(pods)]
    results: dict[str, list[dict[str, float]]] = {}
    with ExitStack() as stack:
        sim = [*SLOROUTER, "sim", "--pods", str(pods), "--port", str(sim_port), "--profile", "llama3-8b-h100",
               "--model", "sim-llama3-8b"]  # fmt: skip
        stack.enter_context(logged_process(sim, [sim_port + i for i in range(pods)]))
        gateways = start_gateways(stack, directory, endpoints, receiver, "streamed")
        for url, _ in gateways.values():
            run_load(url, args, 3.0, directory)
        for round_index in range(args.rounds):
            for name, (url, pid) in gateways.items():
                print(f"streamed round {round_index + 1}: {name}", file=sys.stderr, flush=True)
                before = cpu_seconds(pid)
                load = run_load(url, args, args.stream_seconds, directory)
                ok = max(load["ok"], 1)
                ttft = sorted(load["ttft_ms"])
                results.setdefault(name, []).append(
                    {
                        "cpu_ms": (cpu_seconds(pid) - before) * 1e3 / ok,
                        "ttft_p50_ms": ttft[len(ttft) // 2] if ttft else float("nan"),
                        "failed": float(load["sent"] - load["ok"]),
                    }
                )

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    rows = []
    for name in SETUPS:
        rows.append([
            name, f"{med(name, 'cpu_ms'):.3f}", f"{med(name, 'cpu_ms') - med('off', 'cpu_ms'):+.3f}",
            f"{(med(name, 'cpu_ms') / med('off', 'cpu_ms') - 1) * 100:+.1f} %",
            f"{med(name, 'ttft_p50_ms'):.1f}", f"{sum(r['failed'] for r in results[name]):.0f}",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of each one-token wrk run")
    parser.add_argument("--stream-seconds", type=float, default=20.0)
    parser.add_argument("--stream-rate", type=float, default=20.0, help="streamed requests/s")
    parser.add_argument("--stream-pods", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--output-tokens", type=int, default=256)
    args = parser.parse_args()

    receiver_port = free_port()
    receiver_argv = [sys.executable, str(ROOT / "tests" / "helpers" / "otlp_receiver.py"), str(receiver_port)]
    with tempfile.TemporaryDirectory() as tmp:
        receiver_log = Path(tmp) / "receiver.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with logged_process(receiver_argv, [receiver_port], receiver_log, env=env):
            receiver = f"http://127.0.0.1:{receiver_port}"
            one = one_token(args, receiver, Path(tmp))
            stream = streamed(args, receiver, Path(tmp))
            time.sleep(1.0)
        # Its last line once stopped: "spans N".
        lines = receiver_log.read_text(errors="replace").splitlines()
    spans = next((line for line in reversed(lines) if line.startswith("spans ")), "spans ?")
    print("One-token requests (wrk; req/s with 64 connections, p50 with 1):\n")
    print(markdown_table(
        ["tracing", "req/s", "ratio to off", "p50 ms", "added p50 ms", "gateway CPU ms/req",
         "added CPU ms/req", "non-2xx"], one,
    ))  # fmt: skip
    print(f"\nStreamed chat completions ({args.stream_rate:g} req/s, {args.prompt_tokens} prompt tokens, "
          f"{args.output_tokens} output tokens, {args.stream_pods} pods):\n")  # fmt: skip
    headers = ["tracing", "gateway CPU ms/req", "added CPU ms/req", "change", "client TTFT p50 ms", "failed"]
    print(markdown_table(headers, stream))
    print(f"\nmedians of {args.rounds} rounds; the receiver got {spans.removeprefix('spans ')} spans")


if __name__ == "__main__":
    main()
