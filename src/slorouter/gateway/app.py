"""The OpenAI-compatible HTTP front-end: parse, schedule through the Director, proxy, relay the stream.

The hot path runs on the gateway's own lean HTTP/1.1 server (``http.server``) and upstream client
(``http.upstream``): headers stay raw bytes, the forwarded request head is built in one pass over the
client's headers, and metric children are looked up once per label set.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from slorouter.clock import Clock
from slorouter.config import GatewayConfig
from slorouter.director import Director, RequestLifecycle
from slorouter.gateway.headers import parse_routing_headers
from slorouter.gateway.history import ReplyCollector, history_text, reply_from_body
from slorouter.gateway.openai import ParsedRequest, parse_chat_completion, parse_completion
from slorouter.http.errors import RequestError, sse_error_event
from slorouter.http.headers import HOP_BY_HOP, not_forwarded
from slorouter.http.server import HttpRequest, HttpServer, Response, ServerLimits, json_error, json_response
from slorouter.http.upstream import UpstreamClient, UpstreamError, UpstreamResponse
from slorouter.metrics import GatewayMetrics, LatencyMetrics
from slorouter.scheduling.datakeys import TARGET_PREDICTION_STATE
from slorouter.scheduling.plugins.latency import EXPLORE_ROUTE
from slorouter.scheduling.types import AdmissionDeniedError, InferenceRequest, SchedulingError

log = logging.getLogger(__name__)

ENDPOINT_HEADER = "x-slorouter-endpoint"
ROUTE_HEADER = "x-slorouter-route"
PREDICTED_TTFT_HEADER = b"x-slorouter-predicted-ttft-ms"
PREDICTED_TPOT_HEADER = b"x-slorouter-predicted-tpot-ms"
# Hop-by-hop headers and those computed per hop are never copied across (nor those Connection names).
_NOT_FORWARDED = HOP_BY_HOP | {
    b"host",
    b"content-length",
    b"expect",  # answered by the gateway's server; the body is sent whole upstream
}
# The gateway's server writes its own Date; the upstream's would be a duplicate.
_NOT_RETURNED = _NOT_FORWARDED | {b"date"}
_SSE_EVENT = b"data: "
_SSE_DONE = b"data: [DONE]"
_USAGE_TAIL_BYTES = 4096
_NO_HEALTHY = "no healthy model-server endpoint"


class UpstreamFailedError(Exception):
    """The upstream failed before any byte reached the client; another endpoint may be tried."""


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        director: Director,
        metrics: GatewayMetrics,
        clock: Clock,
        *,
        objectives: Mapping[str, int] | None = None,
        prediction_by_default: bool = False,
        latency_metrics: LatencyMetrics | None = None,
    ) -> None:
        self.config = config
        self.director = director
        self.metrics = metrics
        self.clock = clock
        self.objectives = dict(objectives or {})
        self.prediction_by_default = prediction_by_default
        self.latency_metrics = latency_metrics
        # With streamingMode false the predictor models E2E latency, and the TTFT histograms hold E2E
        # latency, as in the original, so that actual and predicted series compare like with like.
        self.e2e_as_ttft = _e2e_prediction(director)
        self._api_keys = frozenset(f"Bearer {key}" for key in config.api_keys)
        self._client: UpstreamClient | None = None
        self._ids = itertools.count()
        self._id_prefix = f"slr-{os.getpid():x}-{time.time_ns() & 0xFFFFFF:x}-"
        self._endpoint_headers: dict[tuple[str, str], bytes] = {}

    # --- server --------------------------------------------------------------------------------------
    def build_server(self, limits: ServerLimits) -> HttpServer:
        server = HttpServer(max_body_bytes=self.config.max_body_bytes, limits=limits)
        server.add_route("POST", "/v1/completions", self._completions)
        server.add_route("POST", "/v1/chat/completions", self._chat_completions)
        server.add_route("GET", "/v1/models", self._models)
        server.add_route("GET", "/health", self._health)
        server.add_route("GET", "/ready", self._ready)
        server.add_route("GET", "/metrics", self._metrics)
        return server

    async def open(self) -> None:
        """Create the upstream client (needs the running loop)."""
        self._client = UpstreamClient(
            connect_timeout=self.config.connect_timeout_s, total_timeout=self.config.upstream_timeout_s
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    # --- simple routes -------------------------------------------------------------------------------
    async def _health(self, _request: HttpRequest) -> Response:
        return json_response(b'{"status": "ok"}')

    async def _ready(self, _request: HttpRequest) -> Response:
        healthy = len(self.director.pool.healthy_positions())
        if healthy:
            return json_response(json.dumps({"status": "ready", "healthy_endpoints": healthy}).encode())
        return json_error(503, _NO_HEALTHY, headers={"Retry-After": "1"})

    async def _metrics(self, _request: HttpRequest) -> Response:
        return Response(200, self.metrics.render(), content_type=b"text/plain; charset=utf-8")

    async def _models(self, request: HttpRequest) -> Response:
        if not self._authorized(request):
            return _unauthorized()
        healthy = self.director.pool.healthy_positions()
        if not len(healthy):
            return json_error(503, _NO_HEALTHY, headers={"Retry-After": "1"})
        endpoint = self.director.pool.endpoints[int(healthy[0])]
        assert self._client is not None
        try:
            upstream = await self._client.request(endpoint.address, "GET", "/v1/models")
            try:
                body = await upstream.read()
            finally:
                upstream.release()
        except UpstreamError as exc:
            return json_error(502, f"endpoint {endpoint.address} failed: {exc.__class__.__name__}")
        head = _upstream_headers(upstream) + f"{ENDPOINT_HEADER}: {endpoint.address}\r\n".encode("latin-1")
        return Response(upstream.status, body, raw_headers=head)

    # --- inference -----------------------------------------------------------------------------------
    async def _completions(self, request: HttpRequest) -> Response | None:
        return await self._inference(request, "/v1/completions", parse_completion)

    async def _chat_completions(self, request: HttpRequest) -> Response | None:
        return await self._inference(request, "/v1/chat/completions", parse_chat_completion)

    async def _inference(
        self, http: HttpRequest, path: str, parse: Callable[[bytes], ParsedRequest]
    ) -> Response | None:
        # One pass over the client's headers: the scheduler's view, the auth check, the forwarded head.
        headers: dict[str, str] = {}
        forward: list[bytes] = []
        request_id = ""
        check_auth = bool(self._api_keys)
        dropped = not_forwarded(http.headers, _NOT_FORWARDED)
        for name, value in http.headers:
            lower = name.lower()
            text = value.decode("latin-1")
            headers[lower.decode("latin-1")] = text
            if lower in dropped:
                continue
            if lower == b"x-request-id":
                request_id = text
                continue
            if check_auth and lower == b"authorization":
                continue  # the gateway's key, not the model server's
            forward.append(b"%s: %s\r\n" % (name, value))
        if check_auth and headers.get("authorization", "") not in self._api_keys:
            self.metrics.count_request("none", 401)
            return _unauthorized()
        if http.too_large:
            self.metrics.count_request("none", 413)
            return json_error(
                413, f"the request body is larger than the limit of {http.max_body_bytes} bytes"
            )
        raw = http.body
        try:
            parsed = parse(raw)
            hints = parse_routing_headers(
                headers, self.objectives, prediction_by_default=self.prediction_by_default
            )
        except RequestError as exc:
            self.metrics.count_request("none", exc.status)
            return json_error(exc.status, exc.message, param=exc.param)
        request_id = request_id or f"{self._id_prefix}{next(self._ids)}"
        forward.append(b"X-Request-Id: %s\r\n" % request_id.encode("latin-1"))
        forward_head = b"".join(forward)
        request = InferenceRequest(
            request_id=request_id,
            model=parsed.model,
            prompt_text=parsed.prompt_text,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
            headers=headers,
            cache_salt=parsed.cache_salt,
            received_at=self.clock.now(),
            priority=hints.priority,
            slo_ttft_ms=hints.slo_ttft_ms,
            slo_tpot_ms=hints.slo_tpot_ms,
            use_prediction=hints.use_prediction,
        )
        attempts = 2 if self.config.retry_on_upstream_failure else 1
        tried: list[str] = []
        last_failure = ""
        for attempt in range(attempts):
            started = time.perf_counter()
            try:
                # Awaited: a data producer may wait on I/O (a remote latency predictor).
                result = await self.director.schedule_async(request, exclude=tried)
            except asyncio.CancelledError:
                self.metrics.client_disconnects.inc()
                raise
            except SchedulingError as exc:
                if tried:  # the failed endpoint was the only one left
                    break
                if isinstance(exc, AdmissionDeniedError) and self.latency_metrics is not None:
                    self.latency_metrics.shed.labels(request.model, request.target_model).inc()
                self.metrics.count_request("none", exc.status)
                return json_error(exc.status, exc.message, code=exc.error_type, headers=exc.headers)
            self.metrics.scheduling_duration.observe(time.perf_counter() - started)
            if attempt:
                self.metrics.upstream_retries.inc()
            if result.primary.route == EXPLORE_ROUTE and self.latency_metrics is not None:
                self.latency_metrics.explorations.inc()
            lifecycle = self.director.dispatch(request, result)
            address = result.target.address
            try:
                return await self._proxy(http, lifecycle, path, raw, forward_head, parsed.history_form)
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
        self.metrics.count_request(tried[-1] if tried else "none", 502)
        return json_error(502, f"the model server failed before responding ({last_failure})")

    async def _proxy(
        self,
        http: HttpRequest,
        lifecycle: RequestLifecycle,
        path: str,
        raw: bytes,
        forward_head: bytes,
        history_form: str,
    ) -> Response | None:
        address = lifecycle.response.endpoint.address
        assert self._client is not None
        try:
            upstream = await self._client.request(address, "POST", path, forward_head, raw)
        except UpstreamError as exc:
            lifecycle.response.error = f"connect: {exc.__class__.__name__}"
            raise UpstreamFailedError(f"{address}: {exc.__class__.__name__}: {exc}") from exc
        try:
            streaming = "text/event-stream" in (upstream.header(b"content-type") or "")
            lifecycle.on_headers(upstream.status, streaming)
            wanted = lifecycle.request.reply_chars_wanted if history_form else 0
            if streaming and upstream.status == 200:
                collector = ReplyCollector(history_form, wanted) if wanted > 0 else None
                return await self._relay_stream(http, lifecycle, upstream, collector)
            return await self._relay_whole(lifecycle, upstream, history_form if wanted > 0 else "")
        finally:
            upstream.release()

    async def _relay_whole(
        self, lifecycle: RequestLifecycle, upstream: UpstreamResponse, history_form: str
    ) -> Response:
        address = lifecycle.response.endpoint.address
        try:
            body = await upstream.read()
        except UpstreamError as exc:
            lifecycle.response.error = f"read: {exc.__class__.__name__}"
            raise UpstreamFailedError(f"{address}: {exc.__class__.__name__}: {exc}") from exc
        error = None if upstream.status < 400 else f"upstream status {upstream.status}"
        history = None
        if history_form and error is None:
            reply = reply_from_body(body, history_form)
            if reply:
                history = history_text(lifecycle.request.prompt_text, reply, history_form)
        lifecycle.on_complete(error=error, history_text=history)
        self._observe(lifecycle)
        head = self._response_head(upstream, lifecycle)
        return Response(upstream.status, body, raw_headers=head)

    async def _relay_stream(
        self,
        http: HttpRequest,
        lifecycle: RequestLifecycle,
        upstream: UpstreamResponse,
        collector: ReplyCollector | None,
    ) -> None:
        address = lifecycle.response.endpoint.address
        # Hold the client's headers back until the first chunk arrives, so that an upstream that dies
        # before sending anything can still be retried elsewhere.
        try:
            first = await upstream.next_chunk()
        except UpstreamError as exc:
            lifecycle.response.error = f"read: {exc.__class__.__name__}"
            raise UpstreamFailedError(f"{address}: {exc.__class__.__name__}: {exc}") from exc
        if not first:
            lifecycle.response.error = "empty stream"
            raise UpstreamFailedError(f"{address}: closed the stream before sending anything")
        head = self._response_head(upstream, lifecycle)
        tail = b""
        chunk = first
        try:
            writer = await http.start_stream(upstream.status, head)
            while chunk:
                events = chunk.count(_SSE_EVENT) - chunk.count(_SSE_DONE)
                if events > 0:
                    lifecycle.on_tokens(events)
                if collector is not None and not collector.full:
                    collector.feed(chunk)
                tail = (tail + chunk)[-_USAGE_TAIL_BYTES:]
                await writer.write(chunk)
                try:
                    chunk = await upstream.next_chunk()
                except UpstreamError as exc:
                    self.metrics.upstream_failures.labels(address, "stream").inc()
                    lifecycle.on_complete(error=f"stream: {exc.__class__.__name__}")
                    await writer.write(sse_error_event(502, f"the model server {address} failed mid-stream"))
                    break
            history = None
            if collector is not None and collector.text:
                history = history_text(lifecycle.request.prompt_text, collector.text, collector.form)
            lifecycle.on_complete(usage=_usage_from_tail(tail), history_text=history)
            self._observe(lifecycle)
            await writer.write_eof()
        except ConnectionResetError:
            self.metrics.client_disconnects.inc()
            lifecycle.on_complete(error="client disconnected")
        return None

    # --- helpers -------------------------------------------------------------------------------------
    def _observe(self, lifecycle: RequestLifecycle) -> None:
        response = lifecycle.response
        request = lifecycle.request
        self.metrics.count_request(response.endpoint.address, response.status)
        if response.status != 200 or response.error or response.first_token_at is None:
            return
        ttft, tpot = self.metrics.latency_children(request.model, request.target_model)
        end = response.completed_at if self.e2e_as_ttft and response.completed_at else response.first_token_at
        ttft.observe(end - request.received_at)
        if response.streaming and response.tokens > 1 and response.completed_at is not None:
            tpot.observe((response.completed_at - response.first_token_at) / (response.tokens - 1))

    def _authorized(self, http: HttpRequest) -> bool:
        if not self._api_keys:
            return True
        value = http.header(b"authorization")
        return value is not None and value.decode("latin-1") in self._api_keys

    def _response_head(self, upstream: UpstreamResponse, lifecycle: RequestLifecycle) -> bytes:
        """The upstream's end-to-end headers, then the gateway's own, as preformatted lines."""
        address = lifecycle.response.endpoint.address
        route = lifecycle.result.primary.route or "heuristic"
        own = self._endpoint_headers.get((address, route))
        if own is None:
            own = f"{ENDPOINT_HEADER}: {address}\r\n{ROUTE_HEADER}: {route}\r\n".encode("latin-1")
            self._endpoint_headers[(address, route)] = own
        parts = [_upstream_headers(upstream), own]
        predicted = lifecycle.request.state.get(TARGET_PREDICTION_STATE)
        if predicted is not None:
            ttft_ms, tpot_ms = predicted
            parts.append(b"%s: %.1f\r\n" % (PREDICTED_TTFT_HEADER, ttft_ms))
            if tpot_ms is not None:
                parts.append(b"%s: %.2f\r\n" % (PREDICTED_TPOT_HEADER, tpot_ms))
        return b"".join(parts)


def _upstream_headers(upstream: UpstreamResponse) -> bytes:
    """The upstream's end-to-end response headers, preformatted."""
    dropped = not_forwarded(upstream.headers, _NOT_RETURNED)
    return b"".join(b"%s: %s\r\n" % (k, v) for k, v in upstream.headers if k.lower() not in dropped)


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


def _unauthorized() -> Response:
    return json_error(
        401, "a valid API key is required (Authorization: Bearer KEY)", headers={"WWW-Authenticate": "Bearer"}
    )


def _too_large(limit: int) -> Response:
    return json_error(413, f"the request body is larger than the limit of {limit} bytes")


def _e2e_prediction(director: Director) -> bool:
    """True when a predicted-latency producer models end-to-end latency (streamingMode false)."""
    for plugin in director.setup.plugins.values():
        params = getattr(plugin, "params", None)
        if plugin.type_name == "predicted-latency-producer" and not getattr(params, "streaming_mode", True):
            return True
    return False
