"""The gateway's HTTP server against uvicorn's httptools protocol and aiohttp's web server, for its own use.

Each server runs alone in a subprocess on uvloop, with the same two routes and no framework on top:
  POST /small   reads a small JSON body, answers a small JSON body (keep-alive: a proxied request's shape)
  POST /stream  answers an SSE stream of 16 events written one by one, then ``data: [DONE]`` (chunked)
and wrk loads it on 127.0.0.1 with one connection (latency) and 64 connections (throughput). The rounds
alternate the servers; the table reports each figure's median over the rounds. The CPU column is the server
process's user+system time per request (/proc): it depends little on what else runs on the machine.

uvicorn is not a dependency of slorouter: install it into the venv to run this (``pip install uvicorn``).

  flock /tmp/slorouter-bench.lock .venv/bin/python benchmarks/bench_http_servers.py [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

from _harness import cpu_seconds, free_port, logged_process, markdown_table, run_wrk

SERVERS = ("hand-written", "uvicorn-httptools", "aiohttp")
BODY = '{"model": "m", "prompt": "Hello, how are you?", "max_tokens": 1}'
SMALL_REPLY = b'{"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "Hi", "index": 0}]}'
EVENT = b'data: {"id": "cmpl-1", "choices": [{"text": "tok", "index": 0}]}\n\n'
EVENTS = 16
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
SSE_HEAD = b"".join(b"%s: %s\r\n" % pair for pair in SSE_HEADERS)


# --- the three servers (each runs in its own process: ``--serve NAME --port P``) -------------------------
async def serve_hand_written(port: int) -> None:
    from slorouter.http.server import HttpRequest, HttpServer, Response, json_response

    async def small(request: HttpRequest) -> Response:
        assert request.body
        return json_response(SMALL_REPLY)

    async def stream(request: HttpRequest) -> None:
        writer = await request.start_stream(200, SSE_HEAD)
        for _ in range(EVENTS):
            await writer.write(EVENT)
        await writer.write(DONE)
        await writer.write_eof()

    server = HttpServer(max_body_bytes=16 * 1024 * 1024)
    server.add_route("POST", "/small", small)
    server.add_route("POST", "/stream", stream)
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


async def serve_uvicorn(port: int) -> None:
    import uvicorn

    Message = dict[str, Any]

    async def app(
        scope: Message, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
    ) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        assert body
        if scope["path"] == "/small":
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(SMALL_REPLY))]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": SMALL_REPLY})
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        for _ in range(EVENTS):
            await send({"type": "http.response.body", "body": EVENT, "more_body": True})
        await send({"type": "http.response.body", "body": DONE, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http="httptools", loop="none", lifespan="off", access_log=False,
        log_level="warning", backlog=1024,
    )  # fmt: skip
    await uvicorn.Server(config).serve()


async def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def small(request: web.Request) -> web.Response:
        assert await request.read()
        return web.Response(body=SMALL_REPLY, content_type="application/json")

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={k.decode(): v.decode() for k, v in SSE_HEADERS})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(EVENTS):
            await response.write(EVENT)
        await response.write(DONE)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/small", small)
    app.router.add_post("/stream", stream)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()


SERVE = {"hand-written": serve_hand_written, "uvicorn-httptools": serve_uvicorn, "aiohttp": serve_aiohttp}


# --- the measurement -------------------------------------------------------------------------------------
def measure(rounds: int, seconds: float) -> None:
    ports = {name: free_port() for name in SERVERS}
    commands = {n: [sys.executable, __file__, "--serve", n, "--port", str(ports[n])] for n in SERVERS}
    results: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    with ExitStack() as stack:
        procs = {name: stack.enter_context(logged_process(commands[name], [ports[name]])) for name in SERVERS}
        for name in SERVERS:  # warm up connections and code paths
            for path in ("/small", "/stream"):
                run_wrk(f"http://127.0.0.1:{ports[name]}{path}", BODY, connections=8, seconds=1)
        for _ in range(rounds):
            for name in SERVERS:
                for path in ("/small", "/stream"):
                    for conns in (1, 64):
                        before = cpu_seconds(procs[name].pid)
                        url = f"http://127.0.0.1:{ports[name]}{path}"
                        r = run_wrk(url, BODY, connections=conns, seconds=seconds)
                        r["cpu_us"] = (cpu_seconds(procs[name].pid) - before) * 1e6 / max(r["requests"], 1.0)
                        if r["non_2xx"] or not r["requests"]:
                            raise SystemExit(f"{name} {path}: {r['non_2xx']:g} non-2xx of {r['requests']:g}")
                        results.setdefault((name, path, conns), []).append(r)
    rows = []
    for path in ("/small", "/stream"):
        for name in SERVERS:
            one, many = results[(name, path, 1)], results[(name, path, 64)]

            def med(runs: list[dict[str, float]], key: str) -> float:
                return statistics.median(r[key] for r in runs)

            rows.append(
                [
                    "small JSON" if path == "/small" else f"SSE, {EVENTS + 1} events",
                    name,
                    f"{med(one, 'p50_ms'):.3f}",
                    f"{med(one, 'p99_ms'):.3f}",
                    f"{med(many, 'rps'):,.0f}",
                    f"{med(many, 'p50_ms'):.2f}",
                    f"{med(many, 'p99_ms'):.2f}",
                    f"{med(many, 'cpu_us'):.0f}",
                ]
            )
    columns = ["workload", "server", "p50 ms (1 conn)", "p99 ms (1 conn)", "req/s (64 conns)", "p50 ms (64)",
               "p99 ms (64)", "server CPU µs/req (64)"]  # fmt: skip
    print(markdown_table(columns, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvloop

        # wrk drops its connections mid-stream at the end of a run, and aiohttp logs a traceback for each:
        # writing them would add to the server's CPU measured here, and fill its log.
        logging.disable(logging.ERROR)
        uvloop.run(SERVE[args.serve](args.port))
        return
    measure(args.rounds, args.seconds)


if __name__ == "__main__":
    main()
