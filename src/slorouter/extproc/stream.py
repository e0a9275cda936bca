"""One ext_proc stream: one HTTP request through Envoy, from its headers to the end of its response.

The stream is an adapter of the ext_proc protocol onto the request's ``Exchange`` (``serving.exchange``),
the same one the HTTP gateway drives: the request headers and body are parsed and validated as the gateway
does, admitted, scheduled and dispatched by the exchange, and the pick goes back as the
``x-gateway-destination-endpoint`` header and ``envoy.lb`` metadata; the response's headers and body chunks
are fed to the exchange, so first-token time, TPOT, training samples, the in-flight release and the outcome
are recorded as the gateway's are. Requests that cannot be routed get an ``ImmediateResponse`` with the
gateway's status, headers and JSON error body; a message that breaks the protocol raises ``ProtocolError``,
which the server turns into a gRPC INVALID_ARGUMENT status.

On an observed response path (``extproc.observer``), the pick leaves a request key in ``slorouter`` dynamic
metadata, and a ``ResponseObserver`` stream claims the request by it and feeds the response to this
stream's exchange: no exchange of messages with the picker is left on the response's path.

A request's plan (``serving.slo_actions``) is carried out with what the data plane allows. A hedge: Envoy's
per-try timeout at the hedge delay, hedging on it (the copy goes to the next endpoint of the pick's list, the
first response headers win); the outcome is read from the response (served address, upstream attempts). A
TTFT deadline: in-band, the picker answers 504 in Envoy's place (an ``ImmediateResponse`` sent on its own,
which resets the upstream request) if the response has not begun by then, holding a streamed response's
headers until its first token when the response body comes full duplex; on the observed path, Envoy's
per-try timeout at the deadline, its local reply saying what the picker would. A TPOT overrun: in-band with
the response body full duplex, the stream is ended with an error event.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slorouter.api.requests import ParsedRequest, check_content_type
from slorouter.api.routing_headers import parse_routing_headers
from slorouter.config import GatewayConfig
from slorouter.director import Director
from slorouter.extproc import messages
from slorouter.extproc.messages import ProtocolError
from slorouter.extproc.observer import ObservationQueue
from slorouter.http.auth import UNAUTHORIZED_MESSAGE, WWW_AUTHENTICATE, BearerTokens
from slorouter.http.errors import SSE_DONE, RequestError, sse_error_event
from slorouter.metrics import GatewayMetrics
from slorouter.scheduling.plugin import Termination
from slorouter.scheduling.types import SchedulingError
from slorouter.serving.audit import PickAudit
from slorouter.serving.engine_priority import EnginePriority
from slorouter.serving.exchange import Exchange, FrontEnd
from slorouter.serving.headers import ENDPOINT_HEADER
from slorouter.serving.recording import TrafficRecorder
from slorouter.serving.requests import INFERENCE_PARSERS
from slorouter.serving.slo_actions import DEADLINE_EXCEEDED, Action, HedgeOutcome, SloActions, ttft_slo
from slorouter.serving.status import RouterStats
from slorouter.serving.traffic_window import TrafficWindow

if TYPE_CHECKING:
    from slorouter.tracing.tracer import Tracing

__all__ = ["Picker", "PickerStream", "ProtocolError"]

log = logging.getLogger(__name__)

Response = Any  # an envoy.service.ext_proc.v3.ProcessingResponse (the generated modules are untyped)
# Sends answers on the stream outside the replies to Envoy's messages (a deadline's immediate response).
Push = Callable[[list[Response]], None]
MODELS_PATH = "/v1/models"
# On an observed response path, how long a routed request waits for its observer to claim it once its
# picking stream ended (the data plane ends that stream as soon as it has nothing more to send on it).
OBSERVER_CLAIM_S = 2.0
_MODE_NAMES = {
    messages.NONE: "NONE",
    messages.STREAMED: "STREAMED",
    messages.BUFFERED: "BUFFERED",
    messages.FULL_DUPLEX_STREAMED: "FULL_DUPLEX_STREAMED",
}


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
    tracing: Tracing | None = None  # None: tracing is off
    stats: RouterStats | None = None  # the status page's per-request figures
    traffic: TrafficRecorder | None = None  # --record
    window: TrafficWindow | None = None  # the recent traffic the tuner reads
    engine_priority: EnginePriority | None = None  # the priority the model servers get in the body
    actions: SloActions | None = None  # deadlines and hedges (None: none configured)
    # The data plane retries on the pick's fallbacks (override_host), so a hedge reaches another endpoint;
    # False (an ORIGINAL_DST cluster, which retries on the same one): no hedge is armed.
    data_plane_hedges: bool = True
    audit: PickAudit | None = None  # routing regret and scores on the wire (None: neither)

    def __post_init__(self) -> None:
        self.front = FrontEnd(
            self.director,
            "extproc",
            self.metrics,
            self.tracing,
            self.stats,
            self.traffic,
            self.window,
            actions=self.actions,
            engine_priority=self.engine_priority,
            audit=self.audit,
        )
        self.api_keys = BearerTokens(self.config.accepted_api_keys)
        # Observed response path: the routed requests whose observer has not claimed them yet, by key.
        self.awaiting_observer: dict[str, PickerStream] = {}
        self.observations = ObservationQueue()
        self._keys = itertools.count(1)

    def next_key(self) -> str:
        return format(next(self._keys), "x")


class PickerStream:
    """The state of one stream; ``handle`` answers each message Envoy sends, in order."""

    def __init__(self, picker: Picker, *, observed: bool = False, push: Push | None = None) -> None:
        self._picker = picker
        self._push = push
        # The response is not sent on this stream: a ResponseObserver stream claims it by ``_key``.
        self._observed = observed
        self._key: str | None = None
        self._observer_claimed = False
        self._phase = _Phase.REQUEST_HEADERS
        self._request_mode = messages.BUFFERED
        self._response_mode: int | None = None  # unknown until Envoy says (protocol_config)
        self._headers: dict[str, str] = {}
        self._parse: Callable[[bytes], ParsedRequest] | None = None
        self._subset: list[str] | None = None
        self._body = bytearray()
        self._exchange: Exchange | None = None  # an inference request's, from its headers on
        self._body_declined = False  # the body of this response was not asked for (it needs no reading)
        # A TTFT deadline kept here (in-band): its timer, and the response headers' answer held (with the
        # body chunks after them) until a stream's first token.
        self._deadline: asyncio.TimerHandle | None = None
        self._held: Response | None = None
        self._held_chunks: list[Response] = []
        self._deadline_in_data_plane = False  # the TTFT deadline is Envoy's per-try timeout (observed)
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
            self._finish()
            return [*self._release(), messages.continue_trailers(request=False)]
        raise ProtocolError(f"a ProcessingRequest without a request, response or trailers part ({kind})")

    def close(self, reason: str) -> None:
        """The gRPC stream ended: a request still in flight is completed (and its load released) now;
        on an observed path the observer's stream tells when the request ends, once it has claimed it."""
        self._cancel_deadline()
        if self._key is not None and not self._observer_claimed:
            lifecycle = None if self._exchange is None else self._exchange.lifecycle
            if lifecycle is not None and not lifecycle.finished:
                asyncio.get_running_loop().call_later(OBSERVER_CLAIM_S, self._unclaimed, reason)
                return
        if not self._observer_claimed:
            self.abandon(reason)

    def _unclaimed(self, reason: str) -> None:
        if self._picker.awaiting_observer.pop(self._key or "", None) is not None:
            self._picker.metrics.unobserved_requests.inc()
            self.abandon(f"{reason}; no observer claimed its response")

    def abandon(self, reason: str) -> None:
        """The stream ended without a whole response: the request is over, the client gone."""
        if self._exchange is not None:
            self._exchange.abandoned(Termination.CLIENT_GONE, reason)
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
        if parse is not None:
            self._exchange = self._picker.front.exchange(method, path, self._headers)
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
            if self._phase is _Phase.ROUTED and self._exchange is None:  # GET /v1/models with a body
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
        exchange = self._exchange
        assert exchange is not None and self._parse is not None
        body = bytes(self._body)
        self._body = bytearray()
        try:
            check_content_type(self._headers.get("content-type"))
            parsed = self._parse(body)
            hints = parse_routing_headers(
                self._headers, picker.objectives, prediction_by_default=picker.prediction_by_default
            )
        except RequestError as exc:
            return self._reject(exc.status, exc.message, param=exc.param)
        set_headers: list[tuple[str, str]] = []
        given_id = self._headers.get("x-request-id") or None
        request = exchange.parsed(parsed, hints, self._headers, given_id)
        if given_id is None:
            set_headers.append(("x-request-id", request.request_id))
        exclude = self._excluded()
        if exclude is None:
            return self._reject(
                503,
                "no healthy model-server endpoint is in the data plane's subset hint "
                f"({self._subset_text()})",
                headers={"Retry-After": "1"},
            )
        try:
            # Flow control: the Envoy stream is held here while the pool is saturated; a cancelled stream
            # cancels this coroutine, which takes the request out of the queue.
            await exchange.admit()
            lifecycle = await exchange.pick(exclude)
        except SchedulingError as exc:
            return self._reject(exc.status, exc.message, code=exc.error_type, headers=exc.headers)
        self._phase = _Phase.ROUTED
        targets = lifecycle.result.primary.targets
        if picker.engine_priority is not None:
            # Envoy retries on the fallbacks with the one body: those that take the priority as the pick does.
            targets = picker.engine_priority.same_form(targets)
        endpoints = [target.address for target in targets]
        kept = self._keep_slo(exchange, len(endpoints) - 1)
        if kept is None:  # the TTFT deadline passed while the request waited in flow control
            return self._reject(504, exchange.deadline_passed(), code=DEADLINE_EXCEEDED)
        plan_headers, plan_metadata = kept
        set_headers += plan_headers
        sent = exchange.upstream_body(body)  # with the priority the pick's model server takes, if any
        # Envoy makes the upstream call; its span's context goes to the model server in the request.
        set_headers += exchange.upstream_context(endpoints[0]).items()
        remove = ["authorization"] if picker.api_keys else []  # the gateway's key, not the model server's
        observed: list[tuple[str, str]] = []
        if self._observed:
            self._key = picker.next_key()
            picker.awaiting_observer[self._key] = self
            # The route adds these to the response (the endpoint: the address that served it, from Envoy).
            assert exchange.facts is not None
            observed = [(messages.REQUEST_KEY, self._key)]
            observed += [(k, v) for k, v in exchange.facts.headers() if k != ENDPOINT_HEADER]
            observed += plan_metadata
        facts = exchange.facts
        scores = () if facts is None or facts.scores is None else facts.scores.scored
        if self._request_mode == messages.FULL_DUPLEX_STREAMED:
            # Envoy forwards a body streamed back without a content-length (chunked to an HTTP/1.1 upstream).
            return [
                messages.routed_headers(
                    endpoints, set_headers, remove, self._mode_override(), observed, scores
                ),
                *messages.streamed_body(sent, request=True),
            ]
        if sent is body:
            return [messages.routed_body(endpoints, set_headers, remove, observed, scores)]
        # BUFFERED: the body is replaced, and Envoy rejects a replacement whose length differs from the
        # content-length it forwards.
        if "content-length" in self._headers:
            set_headers.append(("content-length", str(len(sent))))
        return [messages.routed_body(endpoints, set_headers, remove, observed, scores, body=sent)]

    def _keep_slo(
        self, exchange: Exchange, fallbacks: int
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]] | None:
        """What the request's plan asks of the data plane: Envoy router headers, and on the observed path
        ``slorouter`` metadata for its local reply. A hedge: the per-try timeout at the hedge delay, hedging
        on it, one retry (the copy, to the first of the pick's ``fallbacks``: with none, Envoy would send it
        to the pick again, so none is armed). A TTFT deadline: in-band, a timer here (``_deadline_passed``);
        observed, the per-try timeout at the deadline, not hedging, and the SLO for Envoy's 504. None when
        the deadline has passed already."""
        plan = exchange.plan
        if plan is None:
            return [], []
        now = self._picker.director.clock.now()
        if plan.action is Action.HEDGE:
            due = exchange.hedge_delegated(fallbacks) if self._picker.data_plane_hedges else None
            if due is None:
                return [], []
            hedge = [(messages.HEDGE_ON_PER_TRY_TIMEOUT, "true"), (messages.MAX_RETRIES, "1")]
            return [(messages.PER_TRY_TIMEOUT, _milliseconds(due - now)), *hedge], []
        remaining = plan.deadline_at - now
        if remaining <= 0:
            return None
        if not self._observed and self._push is not None:
            self._deadline = asyncio.get_running_loop().call_later(remaining, self._deadline_passed)
            return [], []
        self._deadline_in_data_plane = True
        timeout = [
            (messages.PER_TRY_TIMEOUT, _milliseconds(remaining)),
            (messages.HEDGE_ON_PER_TRY_TIMEOUT, "false"),
        ]
        return timeout, [(messages.DEADLINE_KEY, ttft_slo(plan))]

    def _deadline_passed(self) -> None:
        """The TTFT deadline passed before the response began (in-band): the picker answers 504 in Envoy's
        place, and Envoy resets the upstream request (the model server frees its slot)."""
        self._deadline = None
        exchange = self._exchange
        if exchange is None or self.closed or self._push is None:
            return
        if self._phase is not _Phase.ROUTED and self._held is None:
            return  # the response began
        self._held = None
        self._held_chunks = []
        self._push(self._reject(504, exchange.deadline_passed(), code=DEADLINE_EXCEEDED))

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

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
        if self._observed or self._response_mode in (
            messages.STREAMED,
            messages.FULL_DUPLEX_STREAMED,
            messages.BUFFERED,
        ):
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
        if self._exchange is not None:
            self._exchange.refuse(status, message)
        else:
            self._picker.metrics.count_request("none", status)
        return [messages.immediate(status, message, param=param, code=code, headers=headers)]

    # --- response ------------------------------------------------------------------------------------
    def _response_headers(self, request: Any) -> list[Response]:
        if self._phase in (_Phase.RESPONSE_BODY, _Phase.DONE):
            raise ProtocolError(f"response headers arrived again (the stream is at: {self._phase.value})")
        message = request.response_headers
        exchange = self._exchange
        if exchange is None or exchange.lifecycle is None:
            # Envoy answered before the pick (a local reply, or GET /v1/models): nothing to observe.
            self._phase = _Phase.RESPONSE_BODY
            return [messages.response_headers([])]
        headers = messages.header_map(message)
        # Where the data plane says it served the request (a response header or envoy.lb metadata), its
        # response flags and its upstream attempts: the generated bootstrap's headers, removed from the
        # client's response.
        served = headers.get(messages.SERVED)
        flags = headers.get(messages.RESPONSE_FLAGS)
        attempts = headers.get(messages.ATTEMPTS)
        remove = [
            name
            for name, value in (
                (messages.SERVED, served),
                (messages.RESPONSE_FLAGS, flags),
                (messages.ATTEMPTS, attempts),
            )
            if value
        ]
        self._account_data_plane(
            exchange,
            served if served is not None else messages.served_metadata(request),
            _failure_phase(flags) if flags else None,
            int(attempts) if attempts and attempts.isdigit() else None,
        )
        body_follows = self._start_response(exchange, headers, message.end_of_stream)
        assert exchange.facts is not None
        own = exchange.facts.headers()
        duplex = self._response_mode == messages.FULL_DUPLEX_STREAMED
        if body_follows and not exchange.reads_body and not duplex:
            # A whole (non-SSE) body that no hook reads: the response is done for the picker, as it is for
            # the gateway's relay, and Envoy need not send the body here (one message less per request).
            self._finish()
            self._body_declined = True
            mode = messages.response_mode(self._request_mode, messages.NONE)
            answer = messages.response_headers(own, mode, remove=remove)
        else:
            answer = messages.response_headers(own, remove=remove)
        if self._deadline is not None and body_follows and duplex and _awaits_first_token(exchange):
            # Full duplex: Envoy sends the body without waiting for this answer, and the client gets
            # nothing until it is given, so the deadline can still answer 504 until the first token.
            self._held = answer
            return []
        self._cancel_deadline()
        return [answer]

    def observe_response_headers(self, request: Any) -> None:
        """The response's headers as the observer saw them (served address and flags as attributes)."""
        exchange = self._exchange
        if self._phase is not _Phase.ROUTED or exchange is None or exchange.lifecycle is None:
            raise ProtocolError(f"observed response headers at an unexpected point ({self._phase.value})")
        served, flag_bits, attempts = messages.response_attributes(request)
        phase = _failure_phase_of_bits(flag_bits)
        if self._deadline_in_data_plane and phase == "timeout":
            # Envoy's per-try timeout at the TTFT deadline: its 504 (a local reply saying what the picker
            # would) went to the client, and the upstream request was reset.
            self._phase = _Phase.DONE
            exchange.refuse(504, exchange.deadline_passed())
            return
        self._account_data_plane(exchange, served, phase, attempts)
        message = request.response_headers
        body_follows = self._start_response(exchange, messages.header_map(message), message.end_of_stream)
        if body_follows and not exchange.reads_body:
            self._finish()  # no hook reads the body: done, as the gateway's relay is

    def observe_response_body(self, chunk: bytes, end_of_stream: bool) -> None:
        if self._phase is _Phase.RESPONSE_BODY:
            self._take_body(chunk, end_of_stream)

    @property
    def response_observed(self) -> bool:
        """The observed response is over for the picker (nothing more to read)."""
        return self._phase is _Phase.DONE

    def claimed_by_observer(self) -> None:
        self._observer_claimed = True
        self._key = None

    def _start_response(self, exchange: Exchange, headers: Mapping[str, str], ended: bool) -> bool:
        """The response's status and kind given to the exchange; True if its body follows."""
        try:
            status = int(headers.get(":status", ""))
        except ValueError:
            raise ProtocolError(f"response headers with a bad :status {headers.get(':status')!r}") from None
        exchange.started(status, "text/event-stream" in headers.get("content-type", ""))
        self._phase = _Phase.RESPONSE_BODY
        if ended:
            self._finish()
        return not ended

    def _account_data_plane(
        self, exchange: Exchange, served: str | None, phase: str | None, attempts: int | None
    ) -> None:
        """A hedge the data plane was armed for is settled (sent or not, won or lost); after a retry on a
        fallback, the load and the samples follow the endpoint that served the request; Envoy's own
        answers to upstream failures are counted by phase."""
        metrics = self._picker.metrics
        assert exchange.lifecycle is not None
        picked = exchange.lifecycle.target.address
        served = served.strip() if served else None
        hedge = exchange.data_plane_answered(served, attempts, failed=phase is not None)
        if hedge is not HedgeOutcome.WON and served and exchange.served_by(served):
            metrics.upstream_retries.inc()
            metrics.upstream_failures.labels(picked, "connect").inc()
        if phase is not None:
            metrics.upstream_failures.labels(exchange.lifecycle.target.address, phase).inc()

    def _response_body(self, chunk: bytes, end_of_stream: bool) -> list[Response]:
        if self._phase is not _Phase.RESPONSE_BODY:
            if self._body_declined:  # Envoy did not take the mode override (allow_mode_override off)
                return self._pass_body(chunk, end_of_stream)
            if self._phase is _Phase.DONE:
                raise ProtocolError("a response body arrived after the response ended")
            raise ProtocolError(f"a response body arrived before the response headers ({self._phase.value})")
        self._take_body(chunk, end_of_stream)
        if not end_of_stream and self._response_mode == messages.FULL_DUPLEX_STREAMED:
            overrun = self._tpot_overrun()
            if overrun is not None:  # the stream ends here: Envoy resets the upstream request
                chunk += sse_error_event(504, overrun, DEADLINE_EXCEEDED) + SSE_DONE
                end_of_stream = True
        passed = self._pass_body(chunk, end_of_stream)
        if self._held is None:
            return passed
        self._held_chunks += passed
        exchange = self._exchange
        assert exchange is not None and exchange.lifecycle is not None
        if exchange.lifecycle.response.first_token_at is None and not end_of_stream:
            return []
        return self._release()

    def _tpot_overrun(self) -> str | None:
        """A stream whose running TPOT is over its plan's limit is answered: the message of its error
        event (None: it keeps to it, or has no limit)."""
        exchange = self._exchange
        if exchange is None:
            return None
        overrun = exchange.tpot_overrun()
        if overrun is not None:
            self._phase = _Phase.DONE
            self.closed = True  # nothing more to pass: the RPC ends after this chunk
        return overrun

    def _release(self) -> list[Response]:
        """The held response headers' answer and the chunks after them (none when nothing is held)."""
        held = self._held
        if held is None:
            return []
        self._cancel_deadline()
        released = [held, *self._held_chunks]
        self._held = None
        self._held_chunks = []
        return released

    def _take_body(self, chunk: bytes, end_of_stream: bool) -> None:
        if self._exchange is not None:
            self._exchange.chunk(chunk)
        if end_of_stream:
            self._finish()

    def _pass_body(self, chunk: bytes, end_of_stream: bool) -> list[Response]:
        if self._response_mode == messages.FULL_DUPLEX_STREAMED:
            return [messages.streamed_chunk(chunk, end_of_stream)]
        return [messages.continue_response_body()]

    def _finish(self) -> None:
        """The response is over (its last body chunk, its trailers, or nothing more to read)."""
        self._phase = _Phase.DONE
        if self._exchange is not None:
            self._exchange.answered()


# Envoy's response flags for upstream failures, by the gateway's failure phases.
_FAILURE_PHASES = {"UF": "connect", "URX": "connect", "UH": "connect", "UO": "connect", "UT": "timeout",
                   "UC": "stream", "UR": "stream"}  # fmt: skip


# The same flags as Envoy's response flag bits (its CoreResponseFlag order), lowest first as in its string.
_FAILURE_PHASE_BITS = ((1, "connect"), (2, "timeout"), (4, "stream"), (5, "connect"), (6, "stream"),
                       (7, "connect"), (15, "connect"))  # fmt: skip


def _failure_phase_of_bits(bits: int) -> str | None:
    for bit, phase in _FAILURE_PHASE_BITS:
        if bits >> bit & 1:
            return phase
    return None


def _failure_phase(flags: str) -> str | None:
    """The phase of the upstream failure Envoy's flags name (comma-separated, "-" for none), if any."""
    for flag in flags.split(","):
        phase = _FAILURE_PHASES.get(flag.strip())
        if phase is not None:
            return phase
    return None


def _awaits_first_token(exchange: Exchange) -> bool:
    """A stream (SSE, 200) that has not sent its first token yet."""
    lifecycle = exchange.lifecycle
    assert lifecycle is not None
    response = lifecycle.response
    return response.streaming and response.status == 200 and response.first_token_at is None


def _milliseconds(seconds: float) -> str:
    """A duration for Envoy's timeout headers: whole milliseconds, at least 1 (0 would mean none)."""
    return str(max(1, math.ceil(seconds * 1000.0)))


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
