"""Liveness, readiness and /metrics handlers for aiohttp applications."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from slorouter.http.json_bodies import json_response


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return handle


async def healthz(_: web.Request) -> web.Response:
    return json_response({"status": "ok"})


def readyz_handler(
    is_ready: Callable[[], bool], detail: Callable[[], dict[str, Any]] | None = None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(_: web.Request) -> web.Response:
        extra = detail() if detail else {}
        if is_ready():
            return json_response({"status": "ready", **extra})
        return json_response({"status": "not ready", **extra}, status=503)

    return handle
