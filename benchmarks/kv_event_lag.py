"""How far behind its timestamp a KV-event batch reaches a subscriber: a simulated pod on 127.0.0.1 under
load publishes over ZMQ, a SUB socket decodes each batch and takes the router's wall clock minus the
batch's ``ts`` (the publisher's wall clock at the step's end), as the KV-event trust's lag rule does.

    .venv/bin/python benchmarks/kv_event_lag.py --seconds 20 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
import time

import aiohttp
import numpy as np
import zmq
import zmq.asyncio

from slorouter.kvevents.wire import decode_batch, parse_message
from slorouter.sim.server import start_pods


async def measure(args: argparse.Namespace) -> list[float]:
    cluster = await start_pods(1, 0, args.profile, kv_events_port=0)
    pod = cluster.pods[0]
    assert pod.kv_events is not None
    sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pod.kv_events.publisher.endpoint)
    lags: list[float] = []
    prompts = itertools.count()
    deadline = time.monotonic() + args.seconds

    async def client(http: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            body = {"model": pod.model, "prompt": f"{next(prompts)} " + "text " * 400, "max_tokens": 32}
            async with http.post(f"http://{pod.address}/v1/completions", json=body) as response:
                await response.read()

    async def listen() -> None:
        while True:
            _, _, payload = parse_message(await sub.recv_multipart())
            lags.append(time.time() - decode_batch(payload).ts)

    listener = asyncio.create_task(listen())
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(*(client(http) for _ in range(args.concurrency)))
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        sub.close(linger=0)
        await cluster.close()
    return lags


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    lags = np.asarray(asyncio.run(measure(args))) * 1000
    if not len(lags):
        print("no batch received", file=sys.stderr)
        return 1
    p50, p99, p999 = np.percentile(lags, [50, 99, 99.9])
    figures = f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, p99.9 {p999:.2f} ms, max {lags.max():.2f} ms"
    print(f"{len(lags)} batches: lag {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
