"""The ext_proc endpoint picker's cost: Envoy + `slorouter epp` against the standalone gateway (`slorouter
serve`) and Envoy alone (round robin to the same pods), heuristic and predicted-latency profiles, in one run.

Two cases:

- ``one-token``: `slorouter sim --profile instant` (no model cost) answers one-token, non-streamed
  replies, so what is measured is the data plane and the picker. Beside the picker runs a null picker
  (``_null_picker.py``: constant answers on the same gRPC server, every request to the first pod): Envoy +
  it is the floor of any picker behind the ext_proc filter on the machine. Added latency with one connection
  (unloaded), throughput with 64 connections (wrk). The rounds alternate the setups; the table reports the
  median of the rounds, and each process's user+system CPU per request (from /proc).
- ``streamed``: the shape users send. Simulated `llama3-8b-h100` pods stream chat replies of
  ``--output-tokens`` tokens (one SSE event per token) to ``--prompt-tokens``-token prompts, at a fixed
  rate (an open-loop load generator in its own process). Reported per setup: CPU per request of the
  router (picker or gateway) and of Envoy, and what each router measured against what the client and the
  model servers measured (TTFT and TPOT means, training samples, tokens, in-flight load after the run), so
  that a cheaper picker is shown to observe as exactly as the gateway.

Envoy runs one worker thread (--concurrency 1): on 2 cores the picker needs the other. The ext_proc filter
runs in the mode given (full-duplex by default, as the original's picker).

    .venv/bin/python benchmarks/bench_extproc.py [--case one-token|streamed|both] [--rounds 3]
        [--seconds 6] [--stream-rate 15] [--stream-seconds 40] [--body-mode full-duplex]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from _harness import (
    SLOROUTER,
    cpu_seconds,
    envoy_process,
    free_port,
    free_port_range,
    logged_process,
    markdown_table,
    run_wrk,
    scrape,
    wait_for_port,
)
from _stream_load import stream_load
from slorouter.extproc.envoy import EnvoySetup

BODY = '{"model": "sim-instant", "prompt": "Hello, how are you?", "max_tokens": 1}'
PREDICTOR = {"mode": "embedded", "prediction_by_default": True, "embedded": {"persist": False}}
PROFILES: dict[str, dict[str, Any]] = {"heuristic": {}, "predicted": {"predictor": PREDICTOR}}
HERE = Path(__file__).resolve().parent


class Target:
    """One setup under test: where to send requests, which processes' CPU is its data plane's, and where
    its router's metrics are."""

    def __init__(self, url: str, router_pid: int | None, envoy_pid: int | None, metrics_url: str | None):
        self.url = url
        self.router_pid = router_pid
        self.envoy_pid = envoy_pid
        self.metrics_url = metrics_url

    @property
    def pids(self) -> list[int]:
        return [pid for pid in (self.router_pid, self.envoy_pid) if pid is not None]


def epp_name(profile: str, path: str, args: argparse.Namespace) -> str:
    return f"envoy + epp {profile}" + (f" ({path})" if len(args.response_paths) > 1 else "")


def start_targets(
    stack: ExitStack, directory: Path, endpoints: list[str], args: argparse.Namespace, model: str
) -> dict[str, Target]:
    targets: dict[str, Target] = {}
    alone = EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", 1, endpoints=tuple(endpoints), ext_proc=False)
    proxy = stack.enter_context(envoy_process(alone, directory))
    targets["envoy alone"] = Target(f"http://127.0.0.1:{alone.listen_port}", None, proxy.pid, None)
    for profile, extra in PROFILES.items():
        gw_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        config = {
            "gateway": {"host": "127.0.0.1", "port": gw_port},
            "pool": {"endpoints": endpoints},
            **extra,
        }
        path = directory / f"{profile}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        serve = [*SLOROUTER, "serve", "--config", str(path), "--log-level", "WARNING"]
        gateway_process = stack.enter_context(logged_process(serve, [gw_port]))
        base = f"http://127.0.0.1:{gw_port}"
        targets[f"gateway {profile}"] = Target(base, gateway_process.pid, None, f"{base}/metrics")
        epp = [*SLOROUTER, "epp", "--config", str(path), "--grpc-port", str(grpc_port),
               "--grpc-health-port", str(free_port()), "--metrics-port", str(metrics_port),
               "--log-level", "WARNING"]  # fmt: skip
        picker = stack.enter_context(logged_process(epp, [grpc_port]))
        for path in args.response_paths:
            setup = EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", grpc_port, endpoints=tuple(endpoints),
                               request_body_mode=args.body_mode, response_path=path)  # fmt: skip
            proxy = stack.enter_context(envoy_process(setup, directory))
            targets[epp_name(profile, path, args)] = Target(
                f"http://127.0.0.1:{setup.listen_port}",
                picker.pid,
                proxy.pid,
                f"http://127.0.0.1:{metrics_port}/metrics",
            )
    if args.null_picker:
        null_port = free_port()
        null_picker = [sys.executable, str(HERE / "_null_picker.py"), str(null_port), endpoints[0]]
        null = stack.enter_context(logged_process(null_picker, [null_port]))
        for path in args.response_paths:
            setup = EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", null_port, endpoints=tuple(endpoints),
                               request_body_mode=args.body_mode, response_path=path)  # fmt: skip
            proxy = stack.enter_context(envoy_process(setup, directory))
            name = "envoy + null picker" + (f" ({path})" if len(args.response_paths) > 1 else "")
            targets[name] = Target(f"http://127.0.0.1:{setup.listen_port}", null.pid, proxy.pid, None)
    for target in targets.values():
        wait_for_port(int(target.url.rsplit(":", 1)[1]))
    return targets


# --- one-token replies ------------------------------------------------------------------------------------


def one_token(args: argparse.Namespace) -> None:
    sim_port = free_port_range(args.pods)
    endpoints = [f"127.0.0.1:{sim_port + i}" for i in range(args.pods)]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        directory = Path(tmp)
        sim = [*SLOROUTER, "sim", "--pods", str(args.pods), "--port", str(sim_port), "--profile", "instant",
               "--model", "sim-instant"]  # fmt: skip
        stack.enter_context(logged_process(sim, [sim_port + i for i in range(args.pods)]))
        args.null_picker = True
        targets = start_targets(stack, directory, endpoints, args, "sim-instant")
        for target in targets.values():  # warm up connections, code paths, and train the predictors
            run_wrk(f"{target.url}/v1/completions", BODY, connections=8, seconds=3)
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for name, target in targets.items():
                for mode, conns in (("latency", 1), ("throughput", 64)):
                    before = [cpu_seconds(pid) for pid in target.pids]
                    r: dict[str, Any] = dict(
                        run_wrk(f"{target.url}/v1/completions", BODY, connections=conns, seconds=args.seconds)
                    )
                    after = [cpu_seconds(pid) for pid in target.pids]
                    requests = max(r["requests"], 1.0)
                    r["cpu_ms"] = [(a - b) * 1e3 / requests for a, b in zip(after, before, strict=True)]
                    results.setdefault((name, mode), []).append(r)

    def med(name: str, mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(name, mode)])

    def cpu(name: str, index: int) -> str:
        values = [r["cpu_ms"][index] for r in results[(name, "throughput")] if len(r["cpu_ms"]) > index]
        return f"{statistics.median(values):.3f}" if values else "–"

    base_p50 = med("envoy alone", "latency", "p50_ms")
    rows = []
    for name in targets:
        p50 = med(name, "latency", "p50_ms")
        cpu_router = cpu(name, 0) if name != "envoy alone" else "–"
        cpu_envoy = cpu(name, 0) if name == "envoy alone" else cpu(name, 1) if "envoy" in name else "–"
        rows.append([
            name, f"{med(name, 'throughput', 'rps'):,.0f}", f"{med(name, 'throughput', 'p50_ms'):.2f}",
            f"{med(name, 'throughput', 'p99_ms'):.2f}", f"{p50:.2f}", f"{med(name, 'latency', 'p99_ms'):.2f}",
            f"{p50 - base_p50:+.2f}", cpu_router, cpu_envoy,
        ])  # fmt: skip
    print(
        markdown_table(
            ["setup", "req/s (64 conns)", "p50 ms (64)", "p99 ms (64)", "p50 ms (1 conn)", "p99 ms (1 conn)",
             "added p50 vs Envoy alone", "picker/gateway CPU ms/req", "Envoy CPU ms/req"],
            rows,
        )
    )  # fmt: skip
    print()
    ratio_rows = []
    for profile in PROFILES:
        for path in args.response_paths:
            gw, epp = f"gateway {profile}", epp_name(profile, path, args)
            rps = med(epp, "throughput", "rps") / med(gw, "throughput", "rps")
            added_gw = med(gw, "latency", "p50_ms") - base_p50
            added_epp = med(epp, "latency", "p50_ms") - base_p50
            null = "envoy + null picker" + (f" ({path})" if len(args.response_paths) > 1 else "")
            floor = med(null, "latency", "p50_ms") - base_p50 - added_gw
            null_rps = med(null, "throughput", "rps") / med(gw, "throughput", "rps")
            added = added_epp - added_gw
            ratio_rows.append(
                [profile, path, f"{rps:.2f}×", f"{null_rps:.2f}×", f"{added:+.2f} ms", f"{floor:+.2f} ms"]
            )
    print(
        markdown_table(
            ["profile", "response path", "Envoy + epp req/s ÷ gateway's", "null picker's",
             "added p50: epp − gateway", "null picker − gateway"],
            ratio_rows,
        )
    )  # fmt: skip
    errors = sum(r["non_2xx"] for rs in results.values() for r in rs)
    print(
        f"\nmedian of {args.rounds} rounds of {args.seconds:g} s; ext_proc body mode {args.body_mode}; "
        f"{args.pods} instant pods; non-2xx responses: {errors:.0f}"
    )


# --- streamed replies -------------------------------------------------------------------------------------


def scrape_pods(endpoints: list[str]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for endpoint in endpoints:
        for name, value in scrape(f"http://{endpoint}/metrics").items():
            totals[name] = totals.get(name, 0.0) + value
    return totals


def run_load(url: str, seconds: float, args: argparse.Namespace, directory: Path) -> dict:
    return stream_load(url, rate=args.stream_rate, seconds=seconds, prompt_tokens=args.prompt_tokens,
                       max_tokens=args.output_tokens, directory=directory)  # fmt: skip


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def mean_of(after: dict[str, float], before: dict[str, float], histogram: str) -> float:
    count = delta(after, before, f"{histogram}_count")
    return delta(after, before, f"{histogram}_sum") / count * 1e3 if count else float("nan")


def streamed(args: argparse.Namespace) -> None:
    pods = args.stream_pods
    sim_port = free_port_range(pods)
    endpoints = [f"127.0.0.1:{sim_port + i}" for i in range(pods)]
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        directory = Path(tmp)
        sim = [*SLOROUTER, "sim", "--pods", str(pods), "--port", str(sim_port), "--profile", "llama3-8b-h100",
               "--model", "sim-llama3-8b"]  # fmt: skip
        stack.enter_context(logged_process(sim, [sim_port + i for i in range(pods)]))
        args.null_picker = False  # it routes every request to one pod: no load of the shape users send
        targets = start_targets(stack, directory, endpoints, args, "sim-llama3-8b")
        for name, target in targets.items():  # warm up, and train the predictors
            print(f"warming up {name}", file=sys.stderr, flush=True)
            run_load(target.url, args.stream_warmup, args, directory)
        idle: dict[str, float] = {}  # the router's CPU with no traffic (scraping the pods), in cores
        for name, target in targets.items():
            if target.router_pid is not None:
                before_idle = cpu_seconds(target.router_pid)
                time.sleep(args.idle_seconds)
                idle[name] = (cpu_seconds(target.router_pid) - before_idle) / args.idle_seconds
        for round_index in range(args.rounds):
            for name, target in targets.items():
                print(f"round {round_index + 1}: {name}", file=sys.stderr, flush=True)
                router_before = scrape(target.metrics_url) if target.metrics_url else {}
                pods_before = scrape_pods(endpoints)
                cpu_before = [cpu_seconds(pid) for pid in target.pids]
                load = run_load(target.url, args.stream_seconds, args, directory)
                cpu_after = [cpu_seconds(pid) for pid in target.pids]
                router_after = scrape(target.metrics_url) if target.metrics_url else {}
                pods_after = scrape_pods(endpoints)
                ok = max(load["ok"], 1)
                cpu_ms = {
                    kind: (after - before) * 1e3 / ok
                    for kind, pid, before, after in zip(
                        ("router" if target.router_pid else "envoy", "envoy"),
                        target.pids,
                        cpu_before,
                        cpu_after,
                        strict=False,
                    )
                }
                tokens = load["tokens"]
                client_tpot = [
                    (e2e - ttft) / (n - 1)
                    for e2e, ttft, n in zip(load["e2e_ms"], load["ttft_ms"], tokens, strict=True)
                    if n > 1
                ]
                row = {
                    "ok": load["ok"],
                    "failed": load["failed"],
                    "router_cpu_ms": cpu_ms.get("router", float("nan")),
                    "envoy_cpu_ms": cpu_ms.get("envoy", float("nan")),
                    "client_ttft_ms": statistics.fmean(load["ttft_ms"]) if load["ttft_ms"] else float("nan"),
                    "client_tpot_ms": statistics.fmean(client_tpot) if client_tpot else float("nan"),
                    "pod_ttft_ms": mean_of(pods_after, pods_before, "vllm:time_to_first_token_seconds"),
                    "pod_tokens": delta(pods_after, pods_before, "vllm:generation_tokens_total"),
                    "client_tokens": float(sum(tokens)),
                    "idle_cores": idle.get(name, float("nan")),
                }
                if target.metrics_url:
                    row |= {
                        "router_ttft_ms": mean_of(
                            router_after, router_before, "inference_objective_request_ttft_seconds"
                        ),
                        "router_tpot_ms": mean_of(
                            router_after, router_before, "inference_objective_request_tpot_seconds"
                        ),
                        "router_ttft_count": delta(
                            router_after, router_before, "inference_objective_request_ttft_seconds_count"
                        ),
                        "samples": delta(router_after, router_before, "slorouter_training_samples_total"),
                        "inflight_after": router_after.get("slorouter_inflight_requests", float("nan")),
                    }
                if load["errors"]:
                    print(f"  errors: {load['errors'][:3]}", file=sys.stderr)
                rows.setdefault(name, []).append(row)

    def med(name: str, key: str) -> float:
        values = [r[key] for r in rows[name] if key in r]
        return statistics.median(values) if values else float("nan")

    def fmt(value: float, digits: int = 2) -> str:
        return "–" if value != value else f"{value:,.{digits}f}"

    table = []
    for name in rows:
        table.append([
            name, fmt(med(name, "ok"), 0), fmt(med(name, "failed"), 0), fmt(med(name, "router_cpu_ms")),
            fmt(med(name, "envoy_cpu_ms")), fmt(med(name, "client_ttft_ms"), 1),
            fmt(med(name, "router_ttft_ms"), 1), fmt(med(name, "pod_ttft_ms"), 1),
            fmt(med(name, "client_tpot_ms")), fmt(med(name, "router_tpot_ms")),
            fmt(med(name, "samples"), 0), fmt(med(name, "client_tokens"), 0), fmt(med(name, "pod_tokens"), 0),
            fmt(med(name, "inflight_after"), 0), fmt(med(name, "idle_cores") * 100, 1),
        ])  # fmt: skip
    print(
        markdown_table(
            ["setup", "ok", "failed", "router CPU ms/req", "Envoy CPU ms/req", "TTFT ms: client",
             "router", "pods", "TPOT ms: client", "router", "training samples", "tokens: client", "pods",
             "in flight after", "router CPU idle, % of a core"],
            table,
        )
    )  # fmt: skip
    print()
    ratio_rows = []
    for profile in PROFILES:
        for path in args.response_paths:
            gw, epp = f"gateway {profile}", epp_name(profile, path, args)
            ratio = med(epp, "router_cpu_ms") / med(gw, "router_cpu_ms")
            per_token = (med(epp, "router_cpu_ms") - med(gw, "router_cpu_ms")) / args.output_tokens * 1e3
            ratio_rows.append([profile, path, f"{ratio:.2f}×", f"{per_token:+.1f} µs"])
    print(
        markdown_table(
            ["profile", "response path", "picker CPU ÷ gateway CPU per request", "difference per token"],
            ratio_rows,
        )
    )
    print(
        f"\nmedian of {args.rounds} round(s) of {args.stream_seconds:g} s at {args.stream_rate:g} req/s; "
        f"{pods} llama3-8b-h100 pods; {args.prompt_tokens}-token prompts, "
        f"{args.output_tokens}-token streamed replies (one SSE event per token, usage included); "
        f"ext_proc body mode {args.body_mode}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--case", choices=["one-token", "streamed", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="one-token: seconds per wrk run")
    parser.add_argument("--pods", type=int, default=2, help="one-token: instant pods")
    parser.add_argument("--stream-pods", type=int, default=4)
    parser.add_argument("--stream-rate", type=float, default=15.0, help="streamed: requests per second")
    parser.add_argument("--stream-seconds", type=float, default=40.0)
    parser.add_argument("--stream-warmup", type=float, default=15.0)
    parser.add_argument(
        "--idle-seconds", type=float, default=5.0, help="streamed: idle CPU measured this long"
    )
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--body-mode", choices=["full-duplex", "buffered"], default="full-duplex")
    parser.add_argument(
        "--response-paths",
        default="observed,in-band",
        help="the Envoy + epp setups, one per response path: observed (a second ext_proc filter in "
        "observability mode) and/or in-band (one filter, every response message answered)",
    )
    args = parser.parse_args()
    args.response_paths = [path.strip() for path in args.response_paths.split(",") if path.strip()]
    if not args.response_paths or set(args.response_paths) - {"observed", "in-band"}:
        parser.error("--response-paths takes observed, in-band or both, comma-separated")
    if args.case in ("one-token", "both"):
        one_token(args)
    if args.case in ("streamed", "both"):
        streamed(args)


if __name__ == "__main__":
    main()
