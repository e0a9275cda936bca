"""The OpenAI-compatible HTTP front-end: its routes, and for inference: authenticate, parse, schedule
through the Director, relay (``gateway.relay``), and retry on another endpoint when the first one fails
before answering.

The hot path runs on the lean HTTP/1.1 server and upstream client: headers stay raw bytes, the forwarded
request head is built in one pass over the client's headers, and metric children are looked up once per
label set.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from slorouter.api.requests import ParsedRequest, check_content_type, parse_chat_completion, parse_completion
from slorouter.api.routing_headers import parse_routing_headers
from slorouter.clock import Clock
from slorouter.config import GatewayConfig
from slorouter.director import Director, RequestLifecycle
from slorouter.gateway.relay import NOT_FORWARDED, Opened, Relay, UpstreamFailedError, upstream_headers
from slorouter.http.auth import UNAUTHORIZED_MESSAGE, WWW_AUTHENTICATE, BearerTokens
from slorouter.http.errors import RequestError
from slorouter.http.headers import connection_listed, drop_listed
from slorouter.http.server import HttpRequest, HttpServer, Response, ServerLimits, json_error, json_response
from slorouter.http.upstream import UpstreamClient, UpstreamError
from slorouter.metrics import GatewayMetrics
from slorouter.scheduling.plugin import Termination
from slorouter.scheduling.types import SchedulingError
from slorouter.serving.audit import PickAudit
from slorouter.serving.engine_priority import EnginePriority
from slorouter.serving.exchange import Exchange, FrontEnd
from slorouter.serving.headers import ENDPOINT_HEADER
from slorouter.serving.recording import TrafficRecorder
from slorouter.serving.slo_actions import DEADLINE_EXCEEDED, Action, SloActions
from slorouter.serving.status import STATUS_PATH, RouterStats, RouterStatus, encode_status
from slorouter.serving.traffic_window import TrafficWindow

if TYPE_CHECKING:
    from slorouter.tracing.tracer import Tracing

log = logging.getLogger(__name__)

_NO_HEALTHY = "no healthy model-server endpoint"
# W3C trace context: read from the client, replaced by the upstream span's when tracing is on.
TRACE_CONTEXT = frozenset((b"traceparent", b"tracestate"))


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
        tracing: Tracing | None = None,
        stats: RouterStats | None = None,
        status: Callable[[], RouterStatus] | None = None,
        traffic: TrafficRecorder | None = None,
        window: TrafficWindow | None = None,
        actions: SloActions | None = None,
        engine_priority: EnginePriority | None = None,
        audit: PickAudit | None = None,
    ) -> None:
        """``stats``: where the relay records finished requests for the status page; ``status``: the page
        (``GET /v1/router/status``; not served without it); ``traffic``: the recording of ``--record``
        (opened and closed by the caller); ``window``: the recent traffic the tuner reads; ``actions``:
        deadlines and hedges (None: none configured); ``engine_priority``: the priority each model server
        is sent in the request body (None: none)."""
        self.config = config
        self.director = director
        self.metrics = metrics
        self.clock = clock
        self.objectives = dict(objectives or {})
        self.prediction_by_default = prediction_by_default
        self._api_keys = BearerTokens(config.accepted_api_keys)
        self._client: UpstreamClient | None = None
        self._relay: Relay | None = None
        self._front = FrontEnd(
            director,
            "gateway",
            metrics,
            tracing,
            stats,
            traffic,
            window,
            actions=actions,
            engine_priority=engine_priority,
            audit=audit,
        )
        self._status = status

    # --- server --------------------------------------------------------------------------------------
    def build_server(self, limits: ServerLimits) -> HttpServer:
        server = HttpServer(max_body_bytes=self.config.max_body_bytes, limits=limits)
        server.add_route("POST", "/v1/completions", self._completions)
        server.add_route("POST", "/v1/chat/completions", self._chat_completions)
        server.add_route("GET", "/v1/models", self._models)
        # Probes and metrics answer whatever the load: outside max_concurrent_requests.
        server.add_route("GET", "/health", self._health, bounded=False)
        server.add_route("GET", "/ready", self._ready, bounded=False)
        server.add_route("GET", "/metrics", self._metrics, bounded=False)
        if self._status is not None:
            server.add_route("GET", STATUS_PATH, self._status_page, bounded=False)
        server.on_limit = self.metrics.count_http_limit
        return server

    async def open(self) -> None:
        """Create the upstream client (needs the running loop)."""
        config = self.config
        self._client = UpstreamClient(
            connect_timeout=config.connect_timeout_s,
            total_timeout=config.upstream_timeout_s,
            first_byte_timeout=config.upstream_first_byte_timeout_s,
            idle_timeout=config.upstream_idle_timeout_s,
        )
        self._relay = Relay(self._client, self.metrics, max_body_bytes=config.max_upstream_body_bytes)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
            self._relay = None

    # --- simple routes -------------------------------------------------------------------------------
    async def _health(self, _request: HttpRequest) -> Response:
        return json_response(b'{"status": "ok"}')

    async def _ready(self, _request: HttpRequest) -> Response:
        healthy = len(self.director.healthy_endpoints())
        if healthy:
            return json_response(json.dumps({"status": "ready", "healthy_endpoints": healthy}).encode())
        return json_error(503, _NO_HEALTHY, headers={"Retry-After": "1"})

    async def _metrics(self, _request: HttpRequest) -> Response:
        return Response(200, self.metrics.render(), content_type=b"text/plain; charset=utf-8")

    async def _status_page(self, _request: HttpRequest) -> Response:
        assert self._status is not None
        return json_response(encode_status(self._status()))

    async def _models(self, request: HttpRequest) -> Response:
        if not self._authorized(request):
            return _unauthorized()
        healthy = self.director.healthy_endpoints()
        if not healthy:
            return json_error(503, _NO_HEALTHY, headers={"Retry-After": "1"})
        endpoint = healthy[0]
        assert self._client is not None
        try:
            upstream = await self._client.request(endpoint.address, "GET", "/v1/models")
            try:
                body = await upstream.read()
            finally:
                upstream.release()
        except UpstreamError as exc:
            return json_error(502, f"endpoint {endpoint.address} failed: {exc.__class__.__name__}")
        head = upstream_headers(upstream) + f"{ENDPOINT_HEADER}: {endpoint.address}\r\n".encode("latin-1")
        return Response(upstream.status, body, raw_headers=head)

    # --- inference -----------------------------------------------------------------------------------
    async def _completions(self, request: HttpRequest) -> Response | None:
        return await self._inference(request, "/v1/completions", parse_completion)

    async def _chat_completions(self, request: HttpRequest) -> Response | None:
        return await self._inference(request, "/v1/chat/completions", parse_chat_completion)

    async def _inference(
        self, http: HttpRequest, path: str, parse: Callable[[bytes], ParsedRequest]
    ) -> Response | None:
        context = None
        if self._front.tracing is not None:
            context = {
                name.lower().decode("latin-1"): value.decode("latin-1")
                for name, value in http.headers
                if name.lower() in TRACE_CONTEXT
            }
        exchange = self._front.exchange(http.method, path, context)
        try:
            return await self._serve_inference(http, parse, exchange)
        except asyncio.CancelledError:
            exchange.abandoned(Termination.CLIENT_GONE, "client disconnected")
            raise
        except BaseException as exc:
            exchange.abandoned(
                Termination.CANCELLED,
                f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__,
            )
            raise

    async def _serve_inference(
        self, http: HttpRequest, parse: Callable[[bytes], ParsedRequest], exchange: Exchange
    ) -> Response | None:
        # One pass over the client's headers: the scheduler's view, the auth check, the forwarded head.
        headers: dict[str, str] = {}
        forward: list[bytes] = []
        request_id = ""
        check_auth = bool(self._api_keys)
        connection: list[bytes] = []
        for name, value in http.headers:
            lower = name.lower()
            text = value.decode("latin-1")
            headers[lower.decode("latin-1")] = text
            if lower in NOT_FORWARDED:
                if lower == b"connection":
                    connection.append(value)
                continue
            if lower == b"x-request-id":
                request_id = text
                continue
            if check_auth and lower == b"authorization":
                continue  # the gateway's key, not the model server's
            forward.append(b"%s: %s\r\n" % (name, value))
        if connection:  # rare: the names it lists are hop-by-hop too, wherever they came
            forward = drop_listed(forward, connection_listed(connection))
        if exchange.trace is not None:  # the upstream span's context replaces the client's
            forward = drop_listed(forward, set(TRACE_CONTEXT))
        if check_auth and not self._api_keys.accepts(headers.get("authorization")):
            exchange.refuse(401, UNAUTHORIZED_MESSAGE)
            return _unauthorized()
        if http.too_large:
            message = f"the request body is larger than the limit of {http.max_body_bytes} bytes"
            exchange.refuse(413, message)
            return json_error(413, message)
        raw = http.body
        try:
            check_content_type(headers.get("content-type"))
            parsed = parse(raw)
            hints = parse_routing_headers(
                headers, self.objectives, prediction_by_default=self.prediction_by_default
            )
        except RequestError as exc:
            exchange.refuse(exc.status, exc.message)
            return json_error(exc.status, exc.message, param=exc.param)
        request = exchange.parsed(parsed, hints, headers, request_id or None)
        forward.append(b"X-Request-Id: %s\r\n" % request.request_id.encode("latin-1"))
        try:
            # Flow control: waits here while the pool is saturated (at once without it).
            await exchange.admit()
        except SchedulingError as exc:
            return json_error(exc.status, exc.message, code=exc.error_type, headers=exc.headers)
        return await self._attempts(http, exchange, raw, b"".join(forward))

    async def _attempts(
        self, http: HttpRequest, exchange: Exchange, raw: bytes, forward_head: bytes
    ) -> Response | None:
        """The pick, relayed; after an upstream failure before any byte reached the client, one more pick
        elsewhere (``retry_on_upstream_failure``)."""
        relay = self._relay
        assert relay is not None
        last_failure = ""
        status = 502
        for _ in range(2 if self.config.retry_on_upstream_failure else 1):
            try:
                # Awaited: a data producer may wait on I/O (a remote latency predictor).
                lifecycle = await exchange.pick()
            except SchedulingError as exc:
                if exchange.tried:  # the failed endpoint was the only one left
                    break
                exchange.refuse(exc.status, exc.message)
                return json_error(exc.status, exc.message, code=exc.error_type, headers=exc.headers)
            address = lifecycle.target.address
            head = forward_head
            context = exchange.upstream_context(address)
            if context:
                head += "".join(f"{name}: {value}\r\n" for name, value in context.items()).encode("latin-1")
            try:
                if exchange.plan is None:
                    # The body for this endpoint: with the priority in the form its server takes, if any.
                    return await relay.relay(http, exchange, exchange.upstream_body(raw), head)
                opened = await self._open_keeping_slo(exchange, raw, head, forward_head)
                if opened is None:
                    message = exchange.deadline_passed()
                    exchange.refuse(504, message)
                    return json_error(504, message, code=DEADLINE_EXCEEDED)
                return await relay.deliver(http, exchange, opened)
            except UpstreamFailedError as exc:
                exchange.failed(exc.cause, str(exc), exc.phase)
                last_failure = str(exc)
                status = exc.status
                log.warning("upstream %s failed before responding: %s", exchange.tried[-1], exc)
                if not exc.retryable:
                    break
        if status == 504:
            message = f"the model server did not answer in time ({last_failure})"
        else:
            message = f"the model server failed before responding ({last_failure})"
        exchange.refuse(status, message)
        return json_error(status, message)

    async def _open_keeping_slo(
        self, exchange: Exchange, raw: bytes, head: bytes, forward_head: bytes
    ) -> Opened | None:
        """``Relay.open`` under the request's plan: None when a ``cancel`` deadline passed first (the
        upstream request is cancelled); with ``hedge``, the request is looked at when ``Exchange.hedge_at``
        says, a copy races it once ``Exchange.hedge`` sends one, and the first to answer is returned (the
        other is cancelled). Raises ``UpstreamFailedError`` when every copy failed."""
        relay, plan, lifecycle = self._relay, exchange.plan, exchange.lifecycle
        assert relay is not None and plan is not None and lifecycle is not None
        clock = self.director.clock
        body = exchange.upstream_body(raw)
        primary = asyncio.ensure_future(relay.open(lifecycle.target.address, exchange.path, head, body))
        racing: dict[asyncio.Future[Opened], RequestLifecycle] = {primary: lifecycle}
        try:
            due = plan.deadline_at if plan.action is Action.CANCEL else exchange.hedge_at()
            while due is not None:
                done, _ = await asyncio.wait((primary,), timeout=max(0.0, due - clock.now()))
                if done:
                    break
                if plan.action is Action.CANCEL:
                    return None
                copy = await exchange.hedge()
                if copy is not None:
                    body = exchange.upstream_body(raw, copy)
                    opening = relay.open(copy.target.address, exchange.path, forward_head, body)
                    racing[asyncio.ensure_future(opening)] = copy
                    break
                due = exchange.hedge_at()  # the copy was held back: its next pick, if any
            return await self._first_answer(exchange, racing)
        finally:
            await _cancel_all(racing)

    async def _first_answer(
        self, exchange: Exchange, racing: dict[asyncio.Future[Opened], RequestLifecycle]
    ) -> Opened:
        """The first of the racing opens to answer (taken out of ``racing``); a copy that fails while the
        other still runs is set aside. Raises the last failure when none answers."""
        pending = set(racing)
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: t.exception() is not None):  # an answer before a failure
                failure = task.exception()
                if failure is None:
                    winner = racing.pop(task)
                    exchange.raced(winner)  # a no-op unless the request was hedged
                    return task.result()
                if not isinstance(failure, UpstreamFailedError) or not pending:
                    exchange.copies_failed()  # a no-op unless the request was hedged
                    raise failure
                failed = racing.pop(task)
                log.warning("hedged copy on %s failed before responding: %s", failed.target.address, failure)
                exchange.hedge_failed(failed, failure.cause, str(failure), failure.phase)

    # --- helpers -------------------------------------------------------------------------------------
    def _authorized(self, http: HttpRequest) -> bool:
        return self._api_keys.accepts(http.header(b"authorization"))


async def _cancel_all(racing: dict[asyncio.Future[Opened], RequestLifecycle]) -> None:
    """Cancel the opens still racing (their connections close, so their servers stop the requests) and
    release the answer of one that finished but lost."""
    if not racing:
        return
    for task in racing:
        task.cancel()
    for result in await asyncio.gather(*racing, return_exceptions=True):
        if isinstance(result, Opened):
            result.upstream.release()


def _unauthorized() -> Response:
    return json_error(401, UNAUTHORIZED_MESSAGE, headers=dict(WWW_AUTHENTICATE))
