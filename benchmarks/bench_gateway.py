"""Gateway overhead: the same load sent directly to a simulated pod and through the gateway, in one run.

Upstream: `slorouter sim --profile instant` (no model cost), so what is measured is the proxy itself.
Added latency is measured with one connection (unloaded); throughput with 64 connections.
The rounds alternate direct and gateway runs, and the table reports the median of the rounds.
The CPU columns are each process's user+system time per request (from /proc): unlike req/s on a small
shared machine, they barely depend on what else is running, so they show the gateway's own cost.

    .venv/bin/python benchmarks/bench_gateway.py [--rounds 3] [--seconds 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _harness import SLOROUTER, cpu_seconds, free_port, logged_process, markdown_table, run_wrk

BODY = '{"model": "sim-instant", "prompt": "Hello, how are you?", "max_tokens": 1}'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--pods", type=int, default=1)
    args = parser.parse_args()

    sim_port = free_port()
    gw_port = free_port()
    endpoints = [f"127.0.0.1:{sim_port + i}" for i in range(args.pods)]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gw.yaml"
        config.write_text(
            f"gateway: {{host: 127.0.0.1, port: {gw_port}}}\npool: {{endpoints: {endpoints}}}\n"
        )
        sim = [*SLOROUTER, "sim", "--pods", str(args.pods), "--port", str(sim_port), "--profile", "instant",
               "--model", "sim-instant"]  # fmt: skip
        serve = [*SLOROUTER, "serve", "--config", str(config), "--log-level", "WARNING"]
        with (
            logged_process(sim, [sim_port + i for i in range(args.pods)]) as sim_proc,
            logged_process(serve, [gw_port]) as gw,
        ):
            direct_url = f"http://{endpoints[0]}/v1/completions"
            gateway_url = f"http://127.0.0.1:{gw_port}/v1/completions"
            for url in (direct_url, gateway_url):  # warm up connections and code paths
                run_wrk(url, BODY, connections=8, seconds=1)
            results: dict[tuple[str, str], list[dict[str, float]]] = {}
            for _ in range(args.rounds):
                for name, url in (("direct", direct_url), ("gateway", gateway_url)):
                    for mode, conns in (("latency", 1), ("throughput", 64)):
                        before = cpu_seconds(gw.pid), cpu_seconds(sim_proc.pid)
                        r = run_wrk(url, BODY, connections=conns, seconds=args.seconds)
                        after = cpu_seconds(gw.pid), cpu_seconds(sim_proc.pid)
                        requests = max(r["requests"], 1.0)
                        r["gw_cpu_ms"] = (after[0] - before[0]) * 1e3 / requests
                        r["sim_cpu_ms"] = (after[1] - before[1]) * 1e3 / requests
                        results.setdefault((name, mode), []).append(r)

    def med(name: str, mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(name, mode)])

    rows = []
    for mode, conns in (("latency", 1), ("throughput", 64)):
        d_p50, g_p50 = med("direct", mode, "p50_ms"), med("gateway", mode, "p50_ms")
        d_p99, g_p99 = med("direct", mode, "p99_ms"), med("gateway", mode, "p99_ms")
        d_rps, g_rps = med("direct", mode, "rps"), med("gateway", mode, "rps")
        rows.append([
            f"{conns}", f"{d_rps:,.0f}", f"{g_rps:,.0f}", f"{g_rps / d_rps:.2f}",
            f"{d_p50:.2f}", f"{g_p50:.2f}", f"{g_p50 - d_p50:+.2f}", f"{d_p99:.2f}", f"{g_p99:.2f}",
            f"{med('gateway', mode, 'gw_cpu_ms'):.3f}", f"{med('direct', mode, 'sim_cpu_ms'):.3f}",
        ])  # fmt: skip
    errors = sum(r["non_2xx"] for rs in results.values() for r in rs)
    print(
        markdown_table(
            [
                "connections",
                "direct req/s",
                "gateway req/s",
                "ratio",
                "direct p50 ms",
                "gateway p50 ms",
                "added p50 ms",
                "direct p99 ms",
                "gateway p99 ms",
                "gateway CPU ms/req",
                "pod CPU ms/req (direct)",
            ],
            rows,
        )
    )
    print(f"\nmedian of {args.rounds} rounds of {args.seconds:g} s; non-2xx responses: {errors:.0f}")


if __name__ == "__main__":
    main()
