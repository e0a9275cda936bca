"""The OpenAI-compatible HTTP front-end: parse, schedule through the Director, proxy, relay the stream."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from slorouter.clock import Clock
from slorouter.config import GatewayConfig
from slorouter.director import Director, RequestLifecycle
from slorouter.gateway.errors import RequestError, error_response, sse_error_event
from slorouter.gateway.openai import ParsedRequest, parse_chat_completion, parse_completion
from slorouter.gateway.upstream import UpstreamClient, UpstreamError, UpstreamResponse
from slorouter.metrics import GatewayMetrics
from slorouter.scheduling.types import InferenceRequest, SchedulingError

log = logging.getLogger(__name__)

ENDPOINT_HEADER = "x-slorouter-endpoint"
ROUTE_HEADER = "x-slorouter-route"
# Hop-by-hop headers (RFC 9110 §7.6.1) and those aiohttp computes itself are never copied across.
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_SSE_EVENT = b"data: "
_SSE_DONE = b"data: [DONE]"
_USAGE_TAIL_BYTES = 4096


class UpstreamFailedError(Exception):
    """The upstream failed before any byte reached the client; another endpoint may be tried."""


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        director: Director,
        metrics: GatewayMetrics,
        clock: Clock,
    ) -> None:
        self.config = config
        self.director = director
        self.metrics = metrics
        self.clock = clock
        self._api_keys = frozenset(f"Bearer {key}" for key in config.api_keys)
        self._session: aiohttp.ClientSession | None = None
        self._client: UpstreamClient | None = None
        self._ids = itertools.count()
        self._id_prefix = f"slr-{os.getpid():x}-{time.time_ns() & 0xFFFFFF:x}-"

    # --- application ---------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[_json_errors])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.on_startup.append(self._open_session)
        app.on_cleanup.append(self._close_session)
        return app

    async def _open_session(self, _app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(
            total=self.config.upstream_timeout_s, sock_connect=self.config.connect_timeout_s
        )
        # Bodies pass through untouched: no decompression, no re-encoding.
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        self._client = UpstreamClient(
            connect_timeout=self.config.connect_timeout_s, total_timeout=self.config.upstream_timeout_s
        )

    async def _close_session(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()
        if self._client is not None:
            await self._client.close()

    # --- simple routes -------------------------------------------------------------------------------
    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _ready(self, _request: web.Request) -> web.Response:
        healthy = len(self.director.pool.healthy_positions())
        if healthy:
            return web.json_response({"status": "ready", "healthy_endpoints": healthy})
        return error_response(503, "no healthy model-server endpoint", headers={"Retry-After": "1"})

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return _unauthorized()
        healthy = self.director.pool.healthy_positions()
        if not len(healthy):
            return error_response(503, "no healthy model-server endpoint", headers={"Retry-After": "1"})
        endpoint = self.director.pool.endpoints[int(healthy[0])]
        assert self._session is not None
        try:
            async with self._session.get(f"{endpoint.url}/v1/models") as upstream:
                body = await upstream.read()
                return web.Response(
                    status=upstream.status,
                    body=body,
                    headers=_response_headers(upstream.headers, endpoint.address),
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error_response(502, f"endpoint {endpoint.address} failed: {exc.__class__.__name__}")

    # --- inference -----------------------------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "/v1/completions", parse_completion)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "/v1/chat/completions", parse_chat_completion)

    async def _inference(
        self, http: web.Request, path: str, parse: Callable[[bytes], ParsedRequest]
    ) -> web.StreamResponse:
        if not self._authorized(http):
            self.metrics.requests.labels("none", "401").inc()
            return _unauthorized()
        raw = await http.read()
        try:
            parsed = parse(raw)
        except RequestError as exc:
            self.metrics.requests.labels("none", str(exc.status)).inc()
            return error_response(exc.status, exc.message, param=exc.param)
        request = InferenceRequest(
            request_id=http.headers.get("x-request-id") or f"{self._id_prefix}{next(self._ids)}",
            model=parsed.model,
            prompt_text=parsed.prompt_text,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
            headers={k.lower(): v for k, v in http.headers.items()},
            cache_salt=parsed.cache_salt,
            received_at=self.clock.now(),
        )
        forward_headers = self._forward_headers(http, request.request_id)
        attempts = 2 if self.config.retry_on_upstream_failure else 1
        tried: list[str] = []
        last_failure = ""
        for attempt in range(attempts):
            started = time.perf_counter()
            try:
                result = self.director.schedule(request, exclude=tried)
            except SchedulingError as exc:
                if tried:  # the failed endpoint was the only one left
                    break
                self.metrics.requests.labels("none", str(exc.status)).inc()
                return error_response(exc.status, exc.message, code=exc.error_type, headers=exc.headers)
            self.metrics.scheduling_duration.observe(time.perf_counter() - started)
            if attempt:
                self.metrics.upstream_retries.inc()
            lifecycle = self.director.dispatch(request, result)
            address = result.target.address
            try:
                return await self._proxy(http, lifecycle, path, raw, forward_headers)
            except asyncio.CancelledError:
                self.metrics.client_disconnects.inc()
                lifecycle.response.error = "client disconnected"
                raise
            except UpstreamFailedError as exc:
                last_failure = str(exc)
                tried.append(address)
                self.metrics.upstream_failures.labels(address, "connect").inc()
                log.warning("upstream %s failed before responding: %s", address, exc)
            finally:
                lifecycle.on_complete(error=lifecycle.response.error or "aborted")
        self.metrics.requests.labels(tried[-1] if tried else "none", "502").inc()
        return error_response(502, f"the model server failed before responding ({last_failure})")

    async def _proxy(
        self,
        http: web.Request,
        lifecycle: RequestLifecycle,
        path: str,
        raw: bytes,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        endpoint = lifecycle.response.endpoint
        assert self._client is not None
        fwd = b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
        try:
            upstream = await self._client.request(endpoint.address, "POST", path, fwd, raw)
        except UpstreamError as exc:
            lifecycle.response.error = f"connect: {exc.__class__.__name__}"
            raise UpstreamFailedError(f"{endpoint.address}: {exc.__class__.__name__}: {exc}") from exc
        try:
            streaming = "text/event-stream" in (upstream.header(b"content-type") or "")
            lifecycle.on_headers(upstream.status, streaming)
            if streaming and upstream.status == 200:
                return await self._relay_stream(http, lifecycle, upstream)
            return await self._relay_whole(lifecycle, upstream)
        finally:
            upstream.release()

    async def _relay_whole(self, lifecycle: RequestLifecycle, upstream: UpstreamResponse) -> web.Response:
        endpoint = lifecycle.response.endpoint
        try:
            body = await upstream.read()
        except UpstreamError as exc:
            lifecycle.response.error = f"read: {exc.__class__.__name__}"
            raise UpstreamFailedError(f"{endpoint.address}: {exc.__class__.__name__}: {exc}") from exc
        error = None if upstream.status < 400 else f"upstream status {upstream.status}"
        lifecycle.on_complete(error=error)
        self._observe(lifecycle)
        headers = _response_headers(upstream.headers, endpoint.address)
        headers[ROUTE_HEADER] = lifecycle.result.primary.route or "heuristic"
        return web.Response(status=upstream.status, body=body, headers=headers)

    async def _relay_stream(
        self, http: web.Request, lifecycle: RequestLifecycle, upstream: UpstreamResponse
    ) -> web.StreamResponse:
        endpoint = lifecycle.response.endpoint
        # Hold the client's headers back until the first chunk arrives, so that an upstream that dies
        # before sending anything can still be retried elsewhere.
        try:
            first = await upstream.next_chunk()
        except UpstreamError as exc:
            lifecycle.response.error = f"read: {exc.__class__.__name__}"
            raise UpstreamFailedError(f"{endpoint.address}: {exc.__class__.__name__}: {exc}") from exc
        if not first:
            lifecycle.response.error = "empty stream"
            raise UpstreamFailedError(f"{endpoint.address}: closed the stream before sending anything")
        headers = _response_headers(upstream.headers, endpoint.address)
        headers[ROUTE_HEADER] = lifecycle.result.primary.route or "heuristic"
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(http)
        tail = b""
        chunk = first
        try:
            while chunk:
                events = chunk.count(_SSE_EVENT) - chunk.count(_SSE_DONE)
                if events > 0:
                    lifecycle.on_tokens(events)
                tail = (tail + chunk)[-_USAGE_TAIL_BYTES:]
                await response.write(chunk)
                try:
                    chunk = await upstream.next_chunk()
                except UpstreamError as exc:
                    self.metrics.upstream_failures.labels(endpoint.address, "stream").inc()
                    lifecycle.on_complete(error=f"stream: {exc.__class__.__name__}")
                    await response.write(
                        sse_error_event(502, f"the model server {endpoint.address} failed mid-stream")
                    )
                    break
        except ConnectionResetError:
            self.metrics.client_disconnects.inc()
            lifecycle.on_complete(error="client disconnected")
            return response
        lifecycle.on_complete(usage=_usage_from_tail(tail))
        self._observe(lifecycle)
        await response.write_eof()
        return response

    # --- helpers -------------------------------------------------------------------------------------
    def _observe(self, lifecycle: RequestLifecycle) -> None:
        response = lifecycle.response
        request = lifecycle.request
        self.metrics.requests.labels(response.endpoint.address, str(response.status)).inc()
        if response.status != 200 or response.error or response.first_token_at is None:
            return
        labels = (request.model, request.target_model)
        self.metrics.ttft.labels(*labels).observe(response.first_token_at - request.received_at)
        if response.streaming and response.tokens > 1 and response.completed_at is not None:
            tpot = (response.completed_at - response.first_token_at) / (response.tokens - 1)
            self.metrics.tpot.labels(*labels).observe(tpot)

    def _authorized(self, http: web.Request) -> bool:
        return not self._api_keys or http.headers.get("Authorization", "") in self._api_keys

    def _forward_headers(self, http: web.Request, request_id: str) -> dict[str, str]:
        headers = {k: v for k, v in http.headers.items() if k.lower() not in _NOT_FORWARDED}
        if self._api_keys:
            headers.pop("Authorization", None)  # the gateway's key, not the model server's
        headers["X-Request-Id"] = request_id
        return headers


def _response_headers(upstream: Any, address: str) -> dict[str, str]:
    if isinstance(upstream, list):
        upstream = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in upstream]
    else:
        upstream = upstream.items()
    headers = {k: v for k, v in upstream if k.lower() not in _NOT_FORWARDED}
    headers[ENDPOINT_HEADER] = address
    return headers


def _usage_from_tail(tail: bytes) -> dict[str, Any] | None:
    """The ``usage`` object of the last SSE event that has one (sent with stream_options.include_usage)."""
    position = tail.rfind(b'"usage"')
    if position < 0:
        return None
    start = tail.rfind(_SSE_EVENT, 0, position)
    if start < 0:
        return None
    end = tail.find(b"\n", position)
    try:
        event = json.loads(tail[start + len(_SSE_EVENT) : end if end >= 0 else None])
    except ValueError:
        return None
    usage = event.get("usage") if isinstance(event, dict) else None
    return usage if isinstance(usage, dict) else None


def _unauthorized() -> web.Response:
    return error_response(
        401, "a valid API key is required (Authorization: Bearer KEY)", headers={"WWW-Authenticate": "Bearer"}
    )


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own 404/405/413 answers, as OpenAI-style JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {
            404: f"no route for {request.path}",
            405: f"method {request.method} is not allowed on {request.path}",
            413: f"the request body is larger than the limit of {request.app._client_max_size} bytes",
        }.get(exc.status, exc.reason)
        allow = exc.headers.get("Allow")
        return error_response(exc.status, message, headers={"Allow": allow} if allow else None)
