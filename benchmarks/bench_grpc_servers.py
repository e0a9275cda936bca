"""The ext_proc port's gRPC server (``slorouter.http.grpc_server``) against grpcio's asyncio server, on the
message pattern of an ext_proc stream: one bidirectional stream per request, one small message each way
per step (a response-body chunk and its "continue" answer).

Each server runs alone in a subprocess on uvloop with the same method, whose handler answers every message
at once with a constant 4-byte reply. A grpcio client in another process drives it on 127.0.0.1:

- latency: one stream, one message at a time (ping-pong); round-trip p50 and p99;
- load: ``--streams`` streams at once, each ping-ponging; messages per second, and the server process's
  user+system CPU per message (/proc), which depends little on what else runs on the machine.

The rounds alternate the servers; the table reports each figure's median over the rounds.

    .venv/bin/python benchmarks/bench_grpc_servers.py [--rounds 3] [--messages 3000] [--streams 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from _harness import cpu_seconds, free_port, logged_process, markdown_table

METHOD = "/bench.Echo/Process"
REQUEST = b"\x2a\x04\x0a\x02hi"  # the size of a small response-body chunk message
REPLY = b"\x2a\x00"
SERVERS = ("lean (slorouter.http.grpc_server)", "grpcio aio")


async def serve_lean(port: int) -> None:
    from slorouter.http.grpc_server import GrpcServer

    class Handler:
        finished = False

        def on_message(self, payload: bytes) -> list[bytes]:
            return [REPLY]

        def on_close(self, reason: str | None) -> None:
            pass

    server = GrpcServer({METHOD: lambda fields: Handler()})
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


async def serve_grpcio(port: int) -> None:
    import grpc

    async def process_stream(requests: Any, context: Any) -> Any:
        async for _ in requests:
            yield REPLY

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Process": grpc.stream_stream_rpc_method_handler(process_stream)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def drive(port: int, messages: int, streams: int) -> dict[str, float]:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call_factory = channel.stream_stream(METHOD)

        async def one_stream(count: int, latencies: list[float] | None) -> None:
            call = call_factory()
            for _ in range(count):
                started = time.perf_counter()
                await call.write(REQUEST)
                await call.read()
                if latencies is not None:
                    latencies.append((time.perf_counter() - started) * 1e3)
            await call.done_writing()
            await call.read()  # the end of the stream (trailers)

        await one_stream(200, None)  # warm up
        latencies: list[float] = []
        await one_stream(messages, latencies)
        latencies.sort()
        per_stream = max(messages // streams, 1)
        started = time.perf_counter()
        await asyncio.gather(*(one_stream(per_stream, None) for _ in range(streams)))
        elapsed = time.perf_counter() - started
    return {
        "p50_ms": latencies[len(latencies) // 2],
        "p99_ms": latencies[int(len(latencies) * 0.99)],
        "load_messages": per_stream * streams,
        "load_rate": per_stream * streams / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--serve", choices=["lean", "grpcio"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import uvloop

    if args.serve:
        uvloop.run(serve_lean(args.port) if args.serve == "lean" else serve_grpcio(args.port))
        return
    results: dict[str, list[dict[str, float]]] = {name: [] for name in SERVERS}
    for _ in range(args.rounds):
        for name, kind in zip(SERVERS, ("lean", "grpcio"), strict=True):
            port = free_port()
            command = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
            with logged_process(command, [port]) as server:
                before = cpu_seconds(server.pid)
                result = uvloop.run(drive(port, args.messages, args.streams))
                cpu = cpu_seconds(server.pid) - before
            result["cpu_us"] = cpu * 1e6 / (args.messages + result["load_messages"] + 200)
            results[name].append(result)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    rows = [
        [name, f"{med(name, 'p50_ms') * 1e3:.0f}", f"{med(name, 'p99_ms') * 1e3:.0f}",
         f"{med(name, 'load_rate'):,.0f}", f"{med(name, 'cpu_us'):.1f}"]
        for name in SERVERS
    ]  # fmt: skip
    print(
        markdown_table(
            ["server", "round trip p50 µs (1 stream)", "p99 µs", f"messages/s ({args.streams} streams)",
             "server CPU µs/message"],
            rows,
        )
    )  # fmt: skip
    print(f"\nmedian of {args.rounds} rounds; {args.messages} messages per phase; client: grpcio aio")


if __name__ == "__main__":
    main()
