"""Starting and stopping a server: a listening socket with its URL, whether another process listens on an
address already, and waiting for SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import signal
import socket
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


def address_in_use(host: str, port: int) -> bool:
    """Whether a socket listens on ``host:port`` already, one that shares its port (``SO_REUSEPORT``) too: a
    server binding with ``SO_REUSEPORT`` itself would join that one and take only some of its connections.
    False for port 0 and for a host that is not an IP address (the server's own bind tells about those)."""
    if port == 0:
        return False
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return False
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # A closed connection's TIME_WAIT on the port is no listener: SO_REUSEADDR binds over it.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


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
