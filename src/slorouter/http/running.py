"""Starting and stopping a server: a listening socket with its URL, and waiting for SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from slorouter.http.server import HttpServer


@dataclass
class RunningServer:
    """A server listening on a socket; ``url`` is its base URL."""

    host: str
    port: int
    _close: Callable[[], Awaitable[None]]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        await self._close()


async def listen(app: web.Application, host: str, port: int) -> RunningServer:
    """Serve an aiohttp application."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return RunningServer(str(bound_host), int(bound_port), runner.cleanup)


async def listen_lean(server: HttpServer, host: str, port: int) -> RunningServer:
    """Serve the routes of a lean HTTP/1.1 server (a fraction of aiohttp's CPU per request)."""
    bound_host, bound_port = await server.start(host, port)
    return RunningServer(str(bound_host), int(bound_port), server.close)


async def wait_for_signal() -> None:
    """Return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
