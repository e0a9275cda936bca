"""``slorouter sim``: run simulated vLLM pods until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import uvloop
import zmq

from slorouter.faults.kinds import FaultError, parse_fault_flag
from slorouter.sim.faults import FAULTS
from slorouter.sim.metrics import ENGINES
from slorouter.sim.profiles import PROFILES, get_profile
from slorouter.sim.server import start_pods
from slorouter.sim.variants import VariantError, apply_variant


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 0..65535, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="run simulated vLLM model servers",
        description="Run N simulated vLLM pods (OpenAI API, vLLM /metrics) on consecutive ports.",
    )
    parser.add_argument("--pods", type=_positive_int, default=1, help="number of pods (default 1)")
    parser.add_argument(
        "--port", type=_port, default=8000, help="port of the first pod; 0 picks free ports (default 8000)"
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="llama3-8b-h100",
        help="latency model (default %(default)s)",
    )
    parser.add_argument(
        "--engine",
        default="vllm",
        metavar="LIST",
        help="the /metrics page each pod serves, as that server names its load metrics: "
        f"{', '.join(ENGINES)}; a comma list gives pod i the i-th (the last repeats), e.g. 'vllm,sglang' "
        "(default vllm)",
    )
    parser.add_argument(
        "--engine-variant",
        default="",
        metavar="SPEC",
        help="vary the profile's engine, e.g. 'decode-priority', 'w=1.5,attn=0.5', 'small-kv,late-metrics' "
        "(named variants and keys: docs/simulator.md)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of pod 0's step-time jitter; pod i uses seed+i"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--model", default=None, help="served model name (default: the profile's)")
    parser.add_argument(
        "--kv-events-port",
        type=_port,
        default=None,
        help="publish vLLM KV events: pod i's ZMQ PUB on this port + 2i, its replay ROUTER on the next "
        "(0: free ports; default: off)",
    )
    parser.add_argument(
        "--kv-events-topic", default=None, help="topic of the KV events (default: kv@<host:port>@<model>)"
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="a fault every pod plays from the start, e.g. 'hang,probability=0.1', 'kill-mid-stream,"
        "after_tokens=3,count=5', or the JSON object of POST /admin/faults; repeatable (docs/simulator.md)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.port and args.port + args.pods - 1 > 65535:
        print(
            f"slorouter sim: error: ports {args.port}..{args.port + args.pods - 1} exceed 65535",
            file=sys.stderr,
        )
        return 2
    if args.kv_events_port and args.kv_events_port + 2 * args.pods - 1 > 65535:
        print(
            f"slorouter sim: error: KV-event ports from {args.kv_events_port} exceed 65535", file=sys.stderr
        )
        return 2
    args.engines = [name.strip() for name in args.engine.split(",")]
    unknown = [name for name in args.engines if name not in ENGINES]
    if unknown:
        print(
            f"slorouter sim: error: --engine: {', '.join(map(repr, unknown))} "
            f"not one of {', '.join(ENGINES)}",
            file=sys.stderr,
        )
        return 2
    try:
        args.resolved_profile = apply_variant(get_profile(args.profile), args.engine_variant)
    except VariantError as exc:
        print(f"slorouter sim: error: --engine-variant: {exc}", file=sys.stderr)
        return 2
    try:
        args.faults = [parse_fault_flag(spec, FAULTS) for spec in args.fault]
    except FaultError as exc:
        print(f"slorouter sim: error: --fault: {exc}", file=sys.stderr)
        return 2
    try:
        return uvloop.run(_serve(args))
    except (OSError, zmq.ZMQError) as exc:
        print(f"slorouter sim: error: cannot listen: {exc}", file=sys.stderr)
        return 1


async def _serve(args: argparse.Namespace) -> int:
    cluster = await start_pods(
        args.pods,
        args.port,
        args.resolved_profile,
        host=args.host,
        seed=args.seed,
        model=args.model,
        kv_events_port=args.kv_events_port,
        kv_events_topic=args.kv_events_topic,
        faults=args.faults,
        engines=args.engines,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    model = cluster.pods[0].model
    profile = args.resolved_profile.name
    print(f"slorouter sim: {len(cluster.pods)} pod(s), profile {profile}, model {model}", flush=True)
    for pod in cluster.pods:
        line = f"  {pod.name} http://{pod.address}"
        if pod.metrics.dialect != "vllm":
            line += f" metrics {pod.metrics.dialect}"
        if pod.kv_events is not None:
            publisher = pod.kv_events.publisher
            line += f" kv-events {publisher.endpoint} replay {publisher.replay_endpoint}"
        print(line, flush=True)
    for fault in args.faults:
        print(f"  fault {fault.describe()}", flush=True)
    try:
        await stop.wait()
    finally:
        await cluster.close()
    return 0
