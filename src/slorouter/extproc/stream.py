"""One ext_proc stream: one HTTP request through Envoy, from its headers to the end of its response.

Request headers and body are parsed and validated as the HTTP gateway does (``serving.requests``,
``api.routing_headers``), scheduled by the same ``Director``, and the pick goes back as the
``x-gateway-destination-endpoint`` header and ``envoy.lb`` metadata. The response's headers and body chunks
feed the same ``RequestLifecycle`` hooks the gateway's relay feeds (``api.stream``), so first-token time,
TPOT, training samples and the in-flight release happen the same way. Requests that cannot be routed get an
``ImmediateResponse`` with the gateway's status, headers and JSON error body; a message that breaks the
protocol raises ``ProtocolError``, which the server turns into a gRPC INVALID_ARGUMENT status.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slorouter.api.requests import ParsedRequest
from slorouter.api.routing_headers import parse_routing_headers
from slorouter.api.stream import StreamObserver, observe_body
from slorouter.config import GatewayConfig
from slorouter.director import Director, RequestLifecycle
from slorouter.extproc import messages
from slorouter.http.auth import UNAUTHORIZED_MESSAGE, WWW_AUTHENTICATE, BearerTokens
from slorouter.http.errors import RequestError
from slorouter.metrics import GatewayMetrics
from slorouter.scheduling.types import SchedulingError
from slorouter.serving.headers import routing_response_headers
from slorouter.serving.outcome import OutcomeRecorder
from slorouter.serving.requests import INFERENCE_PARSERS, RequestIds, inference_request

Response = Any  # an envoy.service.ext_proc.v3.ProcessingResponse (the generated modules are untyped)
MODELS_PATH = "/v1/models"
# A non-streaming response body is kept for the reply-text hooks only up to this size.
_MAX_KEPT_RESPONSE_BYTES = 4 << 20
_MODE_NAMES = {
    messages.NONE: "NONE",
    messages.STREAMED: "STREAMED",
    messages.BUFFERED: "BUFFERED",
    messages.FULL_DUPLEX_STREAMED: "FULL_DUPLEX_STREAMED",
}


class ProtocolError(Exception):
    """Envoy sent a message the ext_proc protocol does not allow here (out of order, unknown kind)."""


class _Phase(enum.Enum):
    REQUEST_HEADERS = "request headers"
    REQUEST_BODY = "request body"
    ROUTED = "routed, before the response headers"
    RESPONSE_BODY = "response body"
    DONE = "done"


@dataclass
class Picker:
    """What every stream of one server shares."""

    director: Director
    metrics: GatewayMetrics
    config: GatewayConfig
    objectives: Mapping[str, int]
    prediction_by_default: bool

    def __post_init__(self) -> None:
        self.outcomes = OutcomeRecorder(self.metrics, e2e_as_ttft=self.director.predicts_end_to_end)
        self.ids = RequestIds()
        self.api_keys = BearerTokens(self.config.accepted_api_keys)


class PickerStream:
    """The state of one stream; ``handle`` answers each message Envoy sends, in order."""

    def __init__(self, picker: Picker) -> None:
        self._picker = picker
        self._phase = _Phase.REQUEST_HEADERS
        self._request_mode = messages.BUFFERED
        self._response_mode: int | None = None  # unknown until Envoy says (protocol_config)
        self._headers: dict[str, str] = {}
        self._parse: Callable[[bytes], ParsedRequest] | None = None
        self._subset: list[str] | None = None
        self._body = bytearray()
        self._lifecycle: RequestLifecycle | None = None
        self._observer: StreamObserver | None = None
        self._kept: bytearray | None = None
        self._status = 0
        self._body_declined = False  # the body of this response was not asked for (it needs no reading)
        # An ImmediateResponse was sent: Envoy ends the stream, nothing more is expected.
        self.closed = False

    async def handle(self, message: Any) -> list[Response]:
        """The answers to one message (``step``, awaited when it has to wait)."""
        result = self.step(message)
        return result if isinstance(result, list) else await result

    def step(self, message: Any) -> list[Response] | Awaitable[list[Response]]:
        """The answers to one message: at once, or (only when it schedules) an awaitable of them."""
        kind = message.WhichOneof("request")
        if kind == "response_body":
            return self._response_body(message.response_body.body, message.response_body.end_of_stream)
        if kind == "request_headers":
            return self._request_headers(message)
        if kind == "request_body":
            return self._request_body(message.request_body.body, message.request_body.end_of_stream)
        if kind == "request_trailers":
            return self._request_trailers()
        if kind == "response_headers":
            return self._response_headers(message)
        if kind == "response_trailers":
            if self._phase is _Phase.REQUEST_HEADERS:
                raise ProtocolError("response trailers arrived before the request headers")
            self._finish(None)
            return [messages.continue_trailers(request=False)]
        raise ProtocolError(f"a ProcessingRequest without a request, response or trailers part ({kind})")

    def close(self, reason: str) -> None:
        """The gRPC stream ended: a request still in flight is completed (and its load released) now."""
        lifecycle = self._lifecycle
        if lifecycle is not None and not lifecycle.finished:
            self._picker.metrics.client_disconnects.inc()
            lifecycle.on_complete(error=reason)
        self._phase = _Phase.DONE

    # --- request -------------------------------------------------------------------------------------
    def _request_headers(self, message: Any) -> list[Response]:
        if self._phase is not _Phase.REQUEST_HEADERS:
            raise ProtocolError(f"request headers arrived again (the stream is at: {self._phase.value})")
        if message.HasField("protocol_config"):
            self._request_mode = message.protocol_config.request_body_mode
            self._response_mode = message.protocol_config.response_body_mode
        headers = messages.header_map(message.request_headers)
        method, path = headers.get(":method"), headers.get(":path")
        if not method or not path:
            missing = " and ".join(name for name, v in ((":method", method), (":path", path)) if not v)
            return self._reject(400, f"the request headers have no {missing} pseudo-header")
        path = path.split("?", 1)[0]
        try:
            self._subset = messages.subset_hint(message)
        except ValueError as exc:
            return self._reject(400, f"bad subset hint from the data plane: {exc}")
        self._headers = {name: value for name, value in headers.items() if not name.startswith(":")}
        if path == MODELS_PATH and method == "GET":
            return self._route_models() if self._authorized() else self._unauthorized()
        parse = INFERENCE_PARSERS.get(path)
        if parse is None:
            known = ", ".join(f"POST {p}" for p in INFERENCE_PARSERS)
            return self._reject(404, f"no route for {method} {path} (known: {known}, GET {MODELS_PATH})")
        if method != "POST":
            return self._reject(405, f"{path} takes POST, not {method}")
        if not self._authorized():
            return self._unauthorized()
        if self._request_mode not in (messages.BUFFERED, messages.FULL_DUPLEX_STREAMED):
            mode = _MODE_NAMES.get(self._request_mode, str(self._request_mode))
            return self._reject(
                500,
                f"the ext_proc filter sends the request body in mode {mode}; the endpoint picker routes on "
                "the body and needs request_body_mode BUFFERED or FULL_DUPLEX_STREAMED",
            )
        self._parse = parse
        self._phase = _Phase.REQUEST_BODY
        if message.request_headers.end_of_stream:  # no body: the parser says what is missing
            return self._no_body()
        if self._request_mode == messages.BUFFERED:
            return [messages.continue_request_headers(self._mode_override())]
        return []  # FULL_DUPLEX_STREAMED: the headers are answered once the body is whole

    def _authorized(self) -> bool:
        return self._picker.api_keys.accepts(self._headers.get("authorization"))

    def _unauthorized(self) -> list[Response]:
        return self._reject(401, UNAUTHORIZED_MESSAGE, headers=dict(WWW_AUTHENTICATE))

    def _no_body(self) -> list[Response]:
        """A body-less inference request is a client error, answered without scheduling."""
        assert self._parse is not None
        try:
            self._parse(b"")
        except RequestError as exc:
            return self._reject(exc.status, exc.message, param=exc.param)
        return self._reject(400, "the request has no body")

    def _request_body(self, chunk: bytes, end_of_stream: bool) -> list[Response] | Awaitable[list[Response]]:
        if self._phase is not _Phase.REQUEST_BODY:
            if self._phase is _Phase.REQUEST_HEADERS:
                raise ProtocolError("a request body arrived before the request headers")
            if self._phase is _Phase.ROUTED and self._lifecycle is None:  # GET /v1/models with a body
                if self._request_mode == messages.FULL_DUPLEX_STREAMED:
                    return [messages.streamed_chunk(chunk, end_of_stream, request=True)]
                return [messages.continue_request_body()]
            raise ProtocolError(f"a request body arrived after the request was routed ({self._phase.value})")
        limit = self._picker.config.max_body_bytes
        if len(self._body) + len(chunk) > limit:
            return self._reject(413, f"the request body is larger than the limit of {limit} bytes")
        self._body += chunk
        # In BUFFERED mode the one body message is the whole body (trailers may follow it).
        if end_of_stream or self._request_mode == messages.BUFFERED:
            return self._route()
        return []

    def _request_trailers(self) -> list[Response] | Awaitable[list[Response]]:
        if self._phase is _Phase.REQUEST_HEADERS:
            raise ProtocolError("request trailers arrived before the request headers")
        if self._phase is _Phase.REQUEST_BODY:
            return self._route_then_trailers()
        return [messages.continue_trailers(request=True)]

    async def _route_then_trailers(self) -> list[Response]:
        responses = await self._route()
        if not self.closed:
            responses.append(messages.continue_trailers(request=True))
        return responses

    async def _route(self) -> list[Response]:
        picker = self._picker
        body = bytes(self._body)
        self._body = bytearray()
        assert self._parse is not None
        try:
            parsed = self._parse(body)
            hints = parse_routing_headers(
                self._headers, picker.objectives, prediction_by_default=picker.prediction_by_default
            )
        except RequestError as exc:
            return self._reject(exc.status, exc.message, param=exc.param)
        set_headers: list[tuple[str, str]] = []
        request_id = self._headers.get("x-request-id")
        if not request_id:
            request_id = picker.ids.next()
            set_headers.append(("x-request-id", request_id))
        request = inference_request(parsed, hints, self._headers, request_id, picker.director.clock.now())
        exclude = self._excluded()
        if exclude is None:
            return self._reject(
                503,
                "no healthy model-server endpoint is in the data plane's subset hint "
                f"({self._subset_text()})",
                headers={"Retry-After": "1"},
            )
        started = time.perf_counter()
        try:
            result = await picker.director.schedule_async(request, exclude=exclude)
        except SchedulingError as exc:
            return self._reject(exc.status, exc.message, code=exc.error_type, headers=exc.headers)
        picker.metrics.scheduling_duration.observe(time.perf_counter() - started)
        self._lifecycle = picker.director.dispatch(request, result)
        self._phase = _Phase.ROUTED
        endpoints = [target.address for target in result.primary.targets]
        remove = ["authorization"] if picker.api_keys else []  # the gateway's key, not the model server's
        if self._request_mode == messages.FULL_DUPLEX_STREAMED:
            return [
                messages.routed_headers(endpoints, set_headers, remove, self._mode_override()),
                *messages.streamed_body(body, request=True),
            ]
        return [messages.routed_body(endpoints, set_headers, remove)]

    def _excluded(self) -> list[str] | None:
        """The healthy endpoints outside the subset hint (None: the subset leaves none)."""
        if self._subset is None:
            return []
        wanted = set(self._subset)
        healthy = self._picker.director.healthy_endpoints()
        if not healthy:
            return []  # the Director answers: no healthy endpoint at all
        exclude = [e.address for e in healthy if e.address not in wanted and _host(e.address) not in wanted]
        return exclude if len(exclude) < len(healthy) else None

    def _subset_text(self) -> str:
        subset = self._subset or []
        shown = ", ".join(subset[:8])
        return shown + (f", ... ({len(subset)} in all)" if len(subset) > 8 else "")

    def _route_models(self) -> list[Response]:
        exclude = self._excluded()
        healthy = [] if exclude is None else self._picker.director.candidates(exclude).endpoints
        if not healthy:
            return self._reject(503, "no healthy model-server endpoint", headers={"Retry-After": "1"})
        self._phase = _Phase.ROUTED
        remove = ["authorization"] if self._picker.api_keys else []
        return [messages.routed_headers([healthy[0].address], [], remove, self._mode_override())]

    def _mode_override(self) -> Any:
        """Ask for the response body when Envoy's filter was not configured to send it (or did not say)."""
        if self._response_mode in (messages.STREAMED, messages.FULL_DUPLEX_STREAMED, messages.BUFFERED):
            return None
        return messages.response_mode(self._request_mode, messages.STREAMED)

    def _reject(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> list[Response]:
        self.closed = True
        self._phase = _Phase.DONE
        self._picker.metrics.count_request("none", status)
        return [messages.immediate(status, message, param=param, code=code, headers=headers)]

    # --- response ------------------------------------------------------------------------------------
    def _response_headers(self, request: Any) -> list[Response]:
        if self._phase in (_Phase.RESPONSE_BODY, _Phase.DONE):
            raise ProtocolError(f"response headers arrived again (the stream is at: {self._phase.value})")
        message = request.response_headers
        lifecycle = self._lifecycle
        if lifecycle is None:
            # Envoy answered before the pick (a local reply, or GET /v1/models): nothing to observe.
            self._phase = _Phase.RESPONSE_BODY
            return [messages.response_headers([])]
        headers = messages.header_map(message)
        remove = self._data_plane_report(request, headers, lifecycle)
        try:
            self._status = int(headers.get(":status", ""))
        except ValueError:
            raise ProtocolError(f"response headers with a bad :status {headers.get(':status')!r}") from None
        streaming = "text/event-stream" in headers.get("content-type", "")
        lifecycle.on_headers(self._status, streaming)
        if streaming and self._status == 200:
            self._observer = StreamObserver(lifecycle, lifecycle.request.history_form)
        elif self._status < 400 and lifecycle.request.history_form and lifecycle.reply_chars_wanted > 0:
            self._kept = bytearray()
        self._phase = _Phase.RESPONSE_BODY
        own = routing_response_headers(lifecycle)
        if message.end_of_stream:
            self._finish(None)
        elif (
            self._observer is None
            and self._kept is None
            and self._response_mode != messages.FULL_DUPLEX_STREAMED
        ):
            # A whole (non-SSE) body that no hook reads: the response is done for the picker, as it is for
            # the gateway's relay, and Envoy need not send the body here (one message less per request).
            self._finish(None)
            self._body_declined = True
            mode = messages.response_mode(self._request_mode, messages.NONE)
            return [messages.response_headers(own, mode, remove=remove)]
        return [messages.response_headers(own, remove=remove)]

    def _data_plane_report(
        self, request: Any, headers: Mapping[str, str], lifecycle: RequestLifecycle
    ) -> list[str]:
        """Where the data plane says it served the request (``x-gateway-destination-endpoint-served``, as a
        response header or ``envoy.lb`` metadata): after a retry on a fallback, the load and the samples
        follow. Envoy's response flags tell its own answer to upstream failures from the model server's.
        Returns the data plane's headers to remove from the client's response."""
        served = headers.get(messages.SERVED)
        flags = headers.get(messages.RESPONSE_FLAGS)
        remove = [
            name for name, value in ((messages.SERVED, served), (messages.RESPONSE_FLAGS, flags)) if value
        ]
        if served is None:
            served = messages.served_metadata(request)
        metrics = self._picker.metrics
        picked = lifecycle.target.address
        if served and lifecycle.served_by(served.strip()):
            metrics.upstream_retries.inc()
            metrics.upstream_failures.labels(picked, "connect").inc()
        phase = _failure_phase(flags) if flags else None
        if phase is not None:
            metrics.upstream_failures.labels(lifecycle.target.address, phase).inc()
        return remove

    def _response_body(self, chunk: bytes, end_of_stream: bool) -> list[Response]:
        if self._phase is not _Phase.RESPONSE_BODY:
            if self._body_declined:  # Envoy did not take the mode override (allow_mode_override off)
                return self._pass_body(chunk, end_of_stream)
            if self._phase is _Phase.DONE:
                raise ProtocolError("a response body arrived after the response ended")
            raise ProtocolError(f"a response body arrived before the response headers ({self._phase.value})")
        if self._observer is not None:
            self._observer.feed(chunk)
        elif self._kept is not None:
            if len(self._kept) + len(chunk) <= _MAX_KEPT_RESPONSE_BYTES:
                self._kept += chunk
            else:
                self._kept = None
        if end_of_stream:
            self._finish(None)
        return self._pass_body(chunk, end_of_stream)

    def _pass_body(self, chunk: bytes, end_of_stream: bool) -> list[Response]:
        if self._response_mode == messages.FULL_DUPLEX_STREAMED:
            return [messages.streamed_chunk(chunk, end_of_stream)]
        return [messages.continue_response_body()]

    def _finish(self, error: str | None) -> None:
        lifecycle = self._lifecycle
        self._phase = _Phase.DONE
        if lifecycle is None or lifecycle.finished:
            return
        usage = None
        if error is None and self._status >= 400:
            error = f"upstream status {self._status}"
        if error is None:
            if self._observer is not None:
                usage = self._observer.finish()
            elif self._kept is not None:
                observe_body(lifecycle, bytes(self._kept), lifecycle.request.history_form)
        lifecycle.on_complete(usage=usage, error=error)
        self._picker.outcomes.record(lifecycle)


# Envoy's response flags for upstream failures, by the gateway's failure phases.
_FAILURE_PHASES = {"UF": "connect", "URX": "connect", "UH": "connect", "UO": "connect", "UT": "timeout",
                   "UC": "stream", "UR": "stream"}  # fmt: skip


def _failure_phase(flags: str) -> str | None:
    """The phase of the upstream failure Envoy's flags name (comma-separated, "-" for none), if any."""
    for flag in flags.split(","):
        phase = _FAILURE_PHASES.get(flag.strip())
        if phase is not None:
            return phase
    return None


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
