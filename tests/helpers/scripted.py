"""Model servers that play a script by call order, not by address (the pick decides which one gets the first
call): a test scripts the first call, the second (a hedged copy) and so on, with plays that answer, fail,
stream, or hang until the router closes the connection (recorded, so a test sees a cancelled request reach
the server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from tests.gateway.conftest import FakeUpstream, eventually


class Scripted:
    """Two fake servers sharing one script: call i (counted across both) runs ``script[i]``. Records which
    calls saw their connection closed by the router before they answered."""

    def __init__(self, *script: Callable[[Scripted, int, web.Request], Awaitable[web.StreamResponse]]):
        self.script = script
        self.calls = 0
        self.closed: list[int] = []  # calls whose client (the router) went away
        self.called: list[str] = []  # the address (host:port) of each call's server
        self.copy_done = asyncio.Event()  # the second call has run its script (or is hanging)
        self.upstreams: list[FakeUpstream] = []

    async def start(self) -> Scripted:
        async def handler(request: web.Request) -> web.StreamResponse:
            index = self.calls
            self.calls += 1
            host, port = request.transport.get_extra_info("sockname")[:2] if request.transport else ("", 0)
            self.called.append(f"{host}:{port}")
            await request.read()
            play = self.script[min(index, len(self.script) - 1)]
            if index == 1 and play is not hang:
                try:
                    return await play(self, index, request)
                finally:
                    self.copy_done.set()
            if index == 1:
                self.copy_done.set()
            return await play(self, index, request)

        self.upstreams = [await FakeUpstream(handler).start() for _ in range(2)]
        return self

    @property
    def addresses(self) -> list[str]:
        return [u.address for u in self.upstreams]

    async def close(self) -> None:
        for upstream in self.upstreams:
            await upstream.close()


async def hang(scripted: Scripted, index: int, request: web.Request) -> web.StreamResponse:
    """Never answer; note when the router closes the connection."""
    for _ in range(1000):
        transport = request.transport
        if transport is None or transport.is_closing():
            scripted.closed.append(index)
            break
        await asyncio.sleep(0.01)
    return web.Response(status=500)


Play = Callable[[Scripted, int, web.Request], Awaitable[web.StreamResponse]]


def answer_after(seconds: float, text: str) -> Play:
    async def answer(scripted: Scripted, index: int, request: web.Request) -> web.Response:
        await asyncio.sleep(seconds)
        body = {"choices": [{"index": 0, "text": text}], "usage": {"completion_tokens": 1}}
        return web.json_response(body)

    return answer


def once_copied(
    then: Callable[[Scripted, int, web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[Scripted, int, web.Request], Awaitable[web.StreamResponse]]:
    """Run ``then`` once the hedged copy has reached a server (and, if it fails, once it has failed)."""

    async def wait(scripted: Scripted, index: int, request: web.Request) -> web.StreamResponse:
        await eventually(lambda: scripted.calls >= 2 and scripted.copy_done.is_set())
        return await then(scripted, index, request)

    return wait


def fail_after(seconds: float) -> Callable[[Scripted, int, web.Request], Awaitable[web.Response]]:
    async def fail(scripted: Scripted, index: int, request: web.Request) -> web.Response:
        await asyncio.sleep(seconds)
        assert request.transport is not None
        request.transport.abort()
        return web.Response(status=500)

    return fail


def slow_stream(tokens: int, interval_s: float) -> Play:
    """A stream (SSE) of ``tokens`` events, one every ``interval_s``; a closed connection is noted."""

    async def stream(scripted: Scripted, index: int, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(tokens):
            chunk = {"choices": [{"index": 0, "text": f"t{i}"}]}
            try:
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            except ConnectionResetError:
                scripted.closed.append(index)
                return response
            await asyncio.sleep(interval_s)
        return response

    return stream


async def headers_then_hang(scripted: Scripted, index: int, request: web.Request) -> web.StreamResponse:
    """A stream whose headers come at once (as vLLM sends them) and no token ever: waits until the router
    closes the connection (noted)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await hang(scripted, index, request)
    return response


def stream_then_hang(tokens: int, interval_s: float) -> Play:
    """A stream of ``tokens`` events, one every ``interval_s``, then silence with the stream open (a server
    that stopped mid-decode) until the router closes the connection (noted)."""

    async def stream(scripted: Scripted, index: int, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(tokens):
            chunk = {"choices": [{"index": 0, "text": f"t{i}"}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(interval_s)
        await hang(scripted, index, request)
        return response

    return stream
