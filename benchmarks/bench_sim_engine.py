"""How fast the simulator runs: engine steps and simulated tokens per second of wall time, and HTTP costs.

Part 1 drives one ``slorouter.sim.engine.Engine`` in virtual time (as the discrete-event cluster simulator
will) through Poisson arrivals, and times only the engine calls (add_request, plan_step, commit_step).
Part 2 (``--http``) measures what the HTTP pods cost: rendering ``/metrics``, scraping it over loopback,
and the request rate of one ``instant`` pod (run as ``slorouter sim`` in a child process).

    .venv/bin/python benchmarks/bench_sim_engine.py [--profile NAME] [--seconds 120] [--seed 0] [--http]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import timeit
from dataclasses import dataclass

import aiohttp
import numpy as np
import uvloop

from _harness import SLOROUTER, free_port, logged_process
from slorouter.sim.engine import Engine
from slorouter.sim.metrics import PodMetrics
from slorouter.sim.profiles import get_profile


@dataclass(frozen=True)
class Workload:
    name: str
    rate: float  # requests per virtual second
    prompt_mean: int  # tokens, lognormal
    output_mean: int  # tokens, lognormal
    shared_prefix: int  # tokens of a system prompt shared by a group of requests
    prefix_groups: int


WORKLOADS = (
    Workload("chat: ~1k prompt (512 shared), ~256 out, 12 req/s", 12.0, 1024, 256, 512, 8),
    Workload("busy chat: same, 16 req/s", 16.0, 1024, 256, 512, 8),
    Workload("overloaded chat: same, 45 req/s (queue grows)", 45.0, 1024, 256, 512, 8),
    Workload("long context: ~8k prompt (4k shared), ~128 out, 3 req/s", 3.0, 8192, 128, 4096, 4),
)


def make_requests(workload: Workload, seconds: float, max_model_len: int, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    prefixes = [
        rng.integers(0, 2**32, workload.shared_prefix, dtype=np.uint32) for _ in range(workload.prefix_groups)
    ]
    requests = []
    now = 0.0
    while True:
        now += rng.exponential(1.0 / workload.rate)
        if now >= seconds:
            return requests
        prompt_len = int(np.clip(rng.lognormal(np.log(workload.prompt_mean), 0.5), 16, max_model_len // 2))
        output_len = int(np.clip(rng.lognormal(np.log(workload.output_mean), 0.6), 1, max_model_len // 4))
        prefix = prefixes[rng.integers(workload.prefix_groups)][: prompt_len // 2]
        suffix = rng.integers(0, 2**32, prompt_len - len(prefix), dtype=np.uint32)
        prompt = np.concatenate([prefix, suffix]).astype("<u4").tobytes()
        requests.append((len(requests), prompt, output_len, now))


def run(engine: Engine, requests: list[tuple]) -> dict[str, float]:
    """Drive the engine through the requests in virtual time; returns counters and the engine's wall time."""
    now = 0.0
    i = 0
    steps = decodes = 0
    ttfts: list[float] = []
    started = time.perf_counter()
    while i < len(requests) or engine.has_work():
        while i < len(requests) and requests[i][3] <= now:
            rid, prompt, output_len, arrival = requests[i]
            engine.add_request(rid, prompt, output_len, arrival)
            i += 1
        step = engine.plan_step(now)
        if step is None:
            wakeups = [
                t for t in (engine.next_ready_time(), requests[i][3] if i < len(requests) else None) if t
            ]
            now = min(wakeups)
            continue
        ttfts += [event.ttft for event in engine.commit_step(step).first_tokens]
        steps += 1
        decodes += step.num_decodes
        now = step.end
    wall = time.perf_counter() - started
    return {
        "steps": steps,
        "wall": wall,
        "virtual": now,
        "mean_decodes": decodes / max(steps, 1),
        "generated": engine.generation_tokens_total,
        "prompt": engine.prompt_tokens_total,
        "preemptions": engine.num_preemptions_total,
        "hit_rate": engine.prefix_cache_hits / max(engine.prefix_cache_queries, 1),
        "ttft_p50": float(np.percentile(ttfts, 50)),
        "ttft_p99": float(np.percentile(ttfts, 99)),
    }


def metrics_render_us() -> float:
    """In-process cost of one /metrics page after its histograms have data."""
    engine = Engine(get_profile("llama3-8b-h100"))
    page = PodMetrics(engine, "sim-llama3-8b")
    for value in np.linspace(0.001, 30.0, 500):
        page.ttft.observe(float(value))
        page.e2e.observe(float(value))
        page.queue.observe(float(value))
    page.render()
    return min(timeit.repeat(page.render, number=2000, repeat=5)) / 2000 * 1e6


async def scrape_us(address: str, count: int = 2000) -> float:
    """Mean round trip of sequential GET /metrics over one keep-alive connection."""
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        for _ in range(count):
            async with session.get(f"http://{address}/metrics") as response:
                await response.read()
        return (time.perf_counter() - started) / count * 1e6


async def request_rate(address: str, stream: bool, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests/s, tokens/s) of ``concurrency`` clients sending 16-token completions for ``seconds``."""
    body = {"prompt": "Measure the proxy, not the model. " * 8, "max_tokens": 16, "stream": stream}
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            async with session.post(f"http://{address}/v1/completions", json=body) as response:
                await response.read()
                done += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return done / elapsed, done * 16 / elapsed


def http_costs(seconds: float) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    with logged_process(
        [*SLOROUTER, "sim", "--pods", "1", "--port", str(port), "--profile", "instant"], [port]
    ):
        print("| measurement | result |")
        print("|---|---:|")
        print(f"| render /metrics in process (histograms filled) | {metrics_render_us():.1f} µs |")
        scrape = uvloop.run(scrape_us(address))
        print(f"| GET /metrics over loopback, sequential, client included | {scrape:.0f} µs |")
        for stream, concurrency in ((False, 32), (True, 32)):
            rate, tokens = uvloop.run(request_rate(address, stream, concurrency, seconds))
            kind = "streamed (SSE)" if stream else "JSON"
            print(
                f"| `instant` pod, {kind} 16-token completions, {concurrency} clients "
                f"| {rate:,.0f} req/s ({tokens:,.0f} tokens/s) |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--seconds", type=float, default=120.0, help="virtual seconds of arrivals")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--http", action="store_true", help="also measure the HTTP pods")
    parser.add_argument("--http-seconds", type=float, default=5.0, help="length of each HTTP load run")
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)

    print(f"Engine speed, profile `{profile.name}`, {args.seconds:g} virtual s of arrivals, seed {args.seed}")
    print()
    print(
        "| workload | requests | steps | mean decodes/step | preemptions | prefix hit rate | TTFT p50 / p99 "
        "| wall s | steps/s | simulated tokens/s | virtual s per wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for workload in WORKLOADS:
        requests = make_requests(workload, args.seconds, profile.max_model_len, args.seed)
        result = run(Engine(profile, seed=args.seed), requests)
        tokens = result["generated"] + result["prompt"]
        print(
            f"| {workload.name} | {len(requests)} | {result['steps']} | {result['mean_decodes']:.0f} "
            f"| {result['preemptions']} | {result['hit_rate']:.0%} "
            f"| {result['ttft_p50'] * 1000:,.0f} / {result['ttft_p99'] * 1000:,.0f} ms "
            f"| {result['wall']:.2f} "
            f"| {result['steps'] / result['wall']:,.0f} | {tokens / result['wall']:,.0f} "
            f"| {result['virtual'] / result['wall']:,.0f} |"
        )
    print()
    print("Simulated tokens = prompt + generated tokens the engine accounted for.")
    if args.http:
        print()
        http_costs(args.http_seconds)
    print(f"Reproduce: .venv/bin/python benchmarks/bench_sim_engine.py {' '.join(sys.argv[1:])}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
