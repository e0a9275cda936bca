"""Simulated vLLM pods over HTTP: one lean HTTP/1.1 server per pod, its engine stepped in real time.

Each pod runs one ``Engine`` and a driver task: plan a step, sleep its duration, commit it, hand the tokens
to the waiting responses. While the engine stays busy, steps are chained on the ideal time line (a step
starts when the previous one ended, not when the event loop got round to it), so timer overshoot does not
accumulate into the simulated latencies. Many pods share one process and one event loop. An engine variant
with stalls or slow periods runs on the pod's clock from the pod's start: a stalled engine plans nothing
and the driver sleeps until its ``next_ready_time`` (the stall's end); a slow or interrupted step is just
a longer one.

The HTTP front-end is the gateway's own server (``slorouter.http.server``: asyncio.Protocol + httptools),
which costs a fraction of aiohttp's CPU per request; the simulated pods share the router's cores in every
benchmark, so their overhead is the benchmark's noise.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``,
``GET /health``, ``GET /metrics``, and ``GET``/``POST``/``DELETE /admin/faults`` to inject faults
(``slorouter.sim.faults``). Every response carries ``x-sim-pod: <pod name>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slorouter.clock import Clock, MonotonicClock
from slorouter.faults.admin import FaultAdmin
from slorouter.faults.kinds import Fault
from slorouter.faults.plan import FaultPlan
from slorouter.http.server import HttpRequest, HttpServer, Response, json_error
from slorouter.kvevents.publisher import ZmqEventPublisher
from slorouter.sim.engine import Engine, Finished, RequestId, RequestRejected, StepOutput
from slorouter.sim.faults import FAULTS, INFERENCE, LISTENER, METRICS
from slorouter.sim.kv_events import PodKVEvents
from slorouter.sim.metrics import CONTENT_TYPE, ENGINES, PodMetrics
from slorouter.sim.profiles import Profile, get_profile
from slorouter.sim.protocol import (
    ApiError,
    GenerationRequest,
    SseWriter,
    created_now,
    new_request_id,
    parse_generation,
    parse_json,
    response_json,
)

logger = logging.getLogger(__name__)

POD_HEADER = "x-sim-pod"
# A step that starts within this long after the previous one ended is chained to it (see module docstring).
_CHAIN_TOLERANCE_S = 0.005
_MAX_BODY_BYTES = 32 * 1024 * 1024  # a prompt at the context limit must get its 400, not a 413
_SSE_HEADERS = b"Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
_JSON = b"application/json; charset=utf-8"
_NOT_JSON = b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>\n"
_NOT_SSE = b"this is not server-sent events\n{{{\n\n"
_NOT_PROMETHEUS = b"<html>\x00\xff garbage {{{ not prometheus text\n"


def _zero_cost(profile: Profile) -> bool:
    """True for a profile whose steps and API overheads all take no time (the ``instant`` profile; not with
    stalls, which take time)."""
    p = profile
    costs = (p.w_ms, p.c_lin_ms, p.c_attn_ms, p.c_kv_ms, p.c_req_ms, p.c_step_ms)
    return not any(costs) and not any((p.api_pre_ms, p.api_post_ms, p.api_per_token_ms, p.stall_every_s))


def _json_response(body: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(body).encode(), content_type=_JSON)


@dataclass(eq=False, slots=True)
class _Active:
    """A request an HTTP handler is waiting on."""

    stream: bool
    handler: asyncio.Task[Any] | None = field(default=None, repr=False)
    pending: int = 0  # tokens produced and not yet written
    cached_tokens: int = 0
    finished: Finished | None = None
    waiter: asyncio.Future[None] | None = field(default=None, repr=False)

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class SimPod:
    """One simulated model server: HTTP front-end, engine, and the loop that steps it in real time."""

    def __init__(
        self,
        name: str,
        engine: Engine,
        model: str,
        clock: Clock | None = None,
        *,
        seed: int = 0,
        metrics_engine: str = "vllm",
    ) -> None:
        self.engine = engine
        self.faults = FaultPlan(seed)
        self._refusing: asyncio.TimerHandle | None = None
        self.model = model
        self.metrics = PodMetrics(engine, model, metrics_engine)
        self._late_gauges = self.metrics.gauges.delayed  # sample the gauges at every step (gauges.py)
        self._clock = clock or MonotonicClock()
        self._active: dict[RequestId, _Active] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._zero_cost = _zero_cost(engine.profile)
        self._priority_scheduling = engine.profile.scheduling_policy == "priority"
        self._stepping = False  # the driver planned a step and has not committed it yet
        self._step_soon = False  # a zero-cost step is scheduled for the end of this loop iteration
        self._driver: asyncio.Task[None] | None = None
        self.kv_events: PodKVEvents | None = None  # see publish_kv_events
        self._server: HttpServer | None = None
        self.address = ""
        self.http = HttpServer(max_body_bytes=_MAX_BODY_BYTES)
        self.http.add_route("POST", "/v1/completions", self._completions)
        self.http.add_route("POST", "/v1/chat/completions", self._chat_completions)
        self.http.add_route("GET", "/v1/models", self._models)
        self.http.add_route("GET", "/health", self._health)
        self.http.add_route("GET", "/metrics", self._metrics)
        FaultAdmin(self.faults, FAULTS, activate=self._activate_fault).add_routes(self.http)
        self.name = name

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        self._name = name
        self.http.extra_headers = f"{POD_HEADER}: {name}\r\n".encode("latin-1")

    async def start(self, host: str, port: int) -> str:
        """Serve on ``host:port`` (0: any free port); returns ``host:port`` as bound."""
        bound_host, bound_port = await self.http.start(host, port)
        self._server = self.http
        self.address = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        self._driver = asyncio.create_task(self._drive(), name=f"sim-driver-{self.name}")
        return self.address

    def publish_kv_events(self, publisher: ZmqEventPublisher) -> None:
        """Publish the engine's KV events (one batch per step that changed its prefix cache)."""
        self.kv_events = PodKVEvents(self.engine, publisher, self.faults)
        publisher.start()

    async def close(self) -> None:
        """Stop serving: requests in flight are cancelled (and aborted in the engine), then the loop stops."""
        if self._refusing is not None:
            self._refusing.cancel()
            self._refusing = None
        for entry in list(self._active.values()):
            if entry.handler is not None:
                entry.handler.cancel()
        if self._server is not None:
            await self._server.close()
            self._server = None
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
            self._driver = None
        if self.kv_events is not None:
            await self.kv_events.close()

    # ------------------------------------------------------------------------------------------ driver

    async def _drive(self) -> None:
        try:
            await self._step_forever()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("simulated pod %s stopped stepping its engine", self.name)
            raise

    async def _step_forever(self) -> None:
        engine = self.engine
        clock = self._clock
        last_end = -math.inf
        while True:
            now = clock.now()
            step = engine.plan_step(last_end if now - last_end < _CHAIN_TOLERANCE_S else now)
            if step is None:
                ready = engine.next_ready_time()
                self._wake.clear()
                if ready is None:
                    await self._wake.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), max(ready - clock.now(), 0.0))
                continue
            self._stepping = True
            if self._late_gauges:  # planning admitted requests and allocated blocks
                self.metrics.gauges.sample(step.start)
            await asyncio.sleep(max(step.end - clock.now(), 0.0))
            # Zero-length steps (the instant profile) would pin the time line while real time moves on.
            last_end = step.end if step.duration > 0 else -math.inf
            self._stepping = False
            self._deliver(engine.commit_step(step))

    def _step_now(self) -> None:
        """Zero-cost profile: run the engine's next step from a loop callback, not from the driver task.

        A step of a zero-cost engine takes no time, so running it at once is what the driver would do too,
        minus the task switches (which are most of such a pod's CPU). Requests that arrive in the same loop
        iteration share the step (one callback). The driver takes over whatever work remains (longer
        outputs, streams).
        """
        self._step_soon = False
        engine = self.engine
        if self._stepping:  # the driver has a step in progress; it plans the next one itself
            self._wake.set()
            return
        step = engine.plan_step(self._clock.now())
        if step is not None:
            self._deliver(engine.commit_step(step))
        if engine.has_work():
            self._wake.set()

    def _deliver(self, output: StepOutput) -> None:
        if self.kv_events is not None:
            self.kv_events.flush()
        if self._late_gauges:
            self.metrics.gauges.sample(output.time)
        active = self._active
        for request_id in output.tokens:
            entry = active.get(request_id)
            if entry is not None and entry.stream:
                entry.pending += 1
                entry.wake()
        for first in output.first_tokens:
            self.metrics.first_token(first)
            entry = active.get(first.request_id)
            if entry is not None:
                entry.cached_tokens = first.cached_tokens
        for done in output.finished:
            self.metrics.finished(done)
            entry = active.get(done.request_id)
            if entry is not None:
                entry.finished = done
                entry.wake()

    # ---------------------------------------------------------------------------------------- handlers

    async def _completions(self, request: HttpRequest) -> Response | None:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: HttpRequest) -> Response | None:
        return await self._generate(request, chat=True)

    async def _generate(self, request: HttpRequest, chat: bool) -> Response | None:
        try:
            if request.too_large:
                raise ApiError(
                    f"The request body is larger than {_MAX_BODY_BYTES} bytes.",
                    status=413,
                    type="BadRequestError",
                )
            parsed = parse_generation(
                parse_json(request.body),
                chat=chat,
                served_model=self.model,
                max_model_len=self.engine.max_model_len,
                priority_scheduling=self._priority_scheduling,
            )
            engine_id = next(self._ids)
            fault = self.faults.draw(INFERENCE) if self.faults else None
            if fault is not None and not (parsed.stream and fault.params.get("after_tokens", 0) > 0):
                return await self._play(request, parsed, fault)
        except ApiError as exc:
            return _json_response(exc.body(), status=exc.status)
        try:
            self.engine.add_request(
                engine_id, parsed.prompt_ids, parsed.max_tokens, self._clock.now(), parsed.priority
            )
        except RequestRejected as exc:
            return _json_response(ApiError(str(exc)).body(), status=400)
        entry = _Active(stream=parsed.stream, handler=asyncio.current_task())
        self._active[engine_id] = entry
        if not self._zero_cost:
            self._wake.set()
        elif not self._step_soon:
            self._step_soon = True
            asyncio.get_running_loop().call_soon(self._step_now)
        try:
            if parsed.stream:
                await self._stream(request, parsed, entry, fault)
                return None
            while entry.finished is None:
                await entry.wait()
            await self._sleep_until(entry.finished.done_time)
            body = response_json(
                parsed, new_request_id(chat), created_now(), entry.finished.output_tokens, entry.cached_tokens
            )
            return Response(200, body, content_type=_JSON)
        finally:
            del self._active[engine_id]
            if entry.finished is None:  # the client went away (or the pod is closing)
                self.engine.abort(engine_id)

    async def _stream(
        self, request: HttpRequest, parsed: GenerationRequest, entry: _Active, fault: Fault | None = None
    ) -> None:
        # A fault mid-stream (kill-mid-stream, hang) strikes once after_tokens tokens were written.
        strike_at = int(fault.param("after_tokens")) if fault is not None else -1
        try:
            response = await request.start_stream(200, _SSE_HEADERS)
            writer = SseWriter(parsed, new_request_id(parsed.chat), created_now())
            while True:
                if writer.sent == strike_at:
                    assert fault is not None
                    if fault.name == "kill-mid-stream":
                        request.abort_connection()
                        return
                    await _forever()
                if entry.pending:
                    count = entry.pending
                    if strike_at > writer.sent:
                        count = min(count, strike_at - writer.sent)
                    entry.pending -= count
                    await response.write(writer.tokens(count))
                    continue
                if entry.finished is not None and writer.sent >= entry.finished.output_tokens:
                    break
                await entry.wait()
            await self._sleep_until(entry.finished.done_time)
            if parsed.include_usage:
                await response.write(writer.usage(entry.cached_tokens))
            await response.write(writer.done())
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away: _generate aborts the request

    async def _play(self, request: HttpRequest, parsed: GenerationRequest, fault: Fault) -> Response | None:
        """Answer a generation request with ``fault`` instead of generating (the engine never sees it)."""
        name = fault.name
        if name == "status":
            status = int(fault.param("status"))
            return json_error(status, f"injected fault: status {status}")
        if name == "non-json":
            return Response(200, _NOT_JSON, content_type=b"text/html")
        if name == "hang":
            await _forever()
        if name == "kill-mid-stream":
            request.abort_connection()
            return None
        body = response_json(parsed, new_request_id(parsed.chat), created_now(), parsed.max_tokens, 0)
        if name == "large-body":
            size = int(fault.param("bytes"))
            text = json.dumps("x" * max(size - len(body), 0))
            body = body.replace(b'{"index": 0, ', b'{"index": 0, "pad": ' + text.encode() + b", ", 1)
        if parsed.stream and name in ("truncated-json", "invalid-sse", "large-body"):
            response = await request.start_stream(200, _SSE_HEADERS)
            if name == "invalid-sse":
                await response.write(_NOT_SSE)
                await response.write_eof()
                return None
            event = b"data: " + body + b"\n\n"
            if name == "truncated-json":
                await response.write(event[: len(event) // 2])
                request.abort_connection()
                return None
            await response.write(event)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return None
        if name == "truncated-json":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            request.write_raw(head % len(body) + body[: len(body) // 2])
            request.abort_connection()
            return None
        if name == "invalid-sse":
            return Response(200, _NOT_SSE, content_type=b"text/event-stream")
        return Response(200, body, content_type=_JSON)

    async def _sleep_until(self, deadline: float) -> None:
        delay = deadline - self._clock.now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _models(self, request: HttpRequest) -> Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": created_now(),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.engine.max_model_len,
        }
        return _json_response({"object": "list", "data": [card]})

    async def _health(self, request: HttpRequest) -> Response:
        return Response()

    async def _metrics(self, request: HttpRequest) -> Response:
        now = self._clock.now()
        fault = self.faults.draw(METRICS) if self.faults else None
        if fault is not None:
            if fault.name == "metrics-hang":
                await _forever()
            if fault.name == "metrics-garbage":
                return Response(body=_NOT_PROMETHEUS, content_type=CONTENT_TYPE.encode())
            if int((now - fault.since) / fault.param("period_s")) % 2 == 0:  # metrics-flap: failing
                return json_error(500, "injected fault: metrics-flap")
        page = self.metrics.render(now)
        return Response(body=page.encode(), content_type=CONTENT_TYPE.encode())

    # ------------------------------------------------------------------------------------------ faults

    def inject(self, fault: Fault, request: HttpRequest | None = None) -> None:
        """Activate ``fault`` (a ``refuse`` strikes at once; ``request``'s connection is spared)."""
        fault.since = self._clock.now()
        if fault.target != LISTENER:
            self.faults.add(fault)
            return
        fault.hits += 1
        if self._refusing is not None:
            self._refusing.cancel()
        self.http.stop_listening(keep=request)
        loop = asyncio.get_running_loop()
        self._refusing = loop.call_later(fault.param("duration_s"), self._listen_again)

    def _listen_again(self) -> None:
        self._refusing = None
        task = asyncio.get_running_loop().create_task(self.http.listen_again())
        _background.add(task)
        task.add_done_callback(_listened)

    def _activate_fault(self, fault: Fault, request: HttpRequest) -> None:
        if fault.target == LISTENER:
            request.keep_alive = False  # its connection is the only one spared, and only for this answer
        self.inject(fault, request)


_background: set[asyncio.Task[None]] = set()


def _listened(task: asyncio.Task[None]) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("simulated pod could not listen again: %s", task.exception())


async def _forever() -> None:
    """Wait until cancelled (the client went away, or the pod closes)."""
    await asyncio.get_running_loop().create_future()


class SimCluster:
    """Pods started by ``start_pods``; close it (or use ``async with``) to stop them."""

    def __init__(self, pods: list[SimPod]) -> None:
        self.pods = pods

    @property
    def addresses(self) -> list[str]:
        return [pod.address for pod in self.pods]

    @property
    def model(self) -> str:
        """The served model name (every pod of a cluster serves the same one)."""
        return self.pods[0].model

    async def close(self) -> None:
        await asyncio.gather(*(pod.close() for pod in self.pods))

    async def __aenter__(self) -> SimCluster:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def start_pods(
    count: int,
    port: int,
    profile: str | Profile,
    *,
    host: str = "127.0.0.1",
    seed: int = 0,
    model: str | None = None,
    jitter_sigma: float | None = None,
    kv_events_port: int | None = None,
    kv_events_topic: str | None = None,
    faults: Sequence[Fault] = (),
    engines: Sequence[str] = ("vllm",),
) -> SimCluster:
    """Start ``count`` pods on ports ``port``..``port+count-1`` (``port=0``: a free port each).

    Pod ``i`` is named ``sim-<its port>``, seeds its engine with ``seed + i`` and serves ``model`` (default:
    the profile's model name). With ``kv_events_port`` pod ``i`` publishes its KV events on
    ``tcp://host:kv_events_port + 2i`` and answers replay on the next port (0: free ports), with topic
    ``kv_events_topic`` (default ``kv@<host:port>@<model>``, as llm-d-inference-sim). Raises ``ValueError``
    for a bad count, port or profile and ``OSError`` (``zmq.ZMQError`` for a KV-event port) when a port
    cannot be bound (pods already started are closed first). Every pod starts with a copy of each of
    ``faults`` active (``slorouter.sim.faults``). Pod ``i`` serves the metric page of ``engines[i]`` (the
    last one repeats for the pods beyond the list; ``slorouter.sim.metrics.ENGINES``).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if not engines or any(name not in ENGINES for name in engines):
        raise ValueError(f"engines must be some of {', '.join(ENGINES)}, got {list(engines)}")
    if not 0 <= port <= 65535 or (port and port + count - 1 > 65535):
        raise ValueError(f"ports {port}..{port + count - 1} are not all valid TCP ports")
    resolved = get_profile(profile) if isinstance(profile, str) else profile
    clock = MonotonicClock()
    pods: list[SimPod] = []
    try:
        for index in range(count):
            # The engine's time line is the pod's clock: its stalls and slow periods start from now.
            engine = Engine(resolved, seed=seed + index, jitter_sigma=jitter_sigma, start_time=clock.now())
            pod = SimPod(
                "",
                engine,
                model or resolved.model,
                clock,
                seed=seed + index,
                metrics_engine=engines[min(index, len(engines) - 1)],
            )
            await pod.start(host, port + index if port else 0)
            for fault in faults:
                pod.inject(dataclasses.replace(fault, params=dict(fault.params)))
            pod.name = f"sim-{pod.address.rsplit(':', 1)[1]}"
            pods.append(pod)
            if kv_events_port is not None:
                pub, replay = (
                    (kv_events_port + 2 * index, kv_events_port + 2 * index + 1)
                    if kv_events_port
                    else ("*", "*")
                )
                zmq_host = f"[{host}]" if ":" in host else host
                topic = kv_events_topic if kv_events_topic is not None else f"kv@{pod.address}@{pod.model}"
                pod.publish_kv_events(
                    ZmqEventPublisher(
                        f"tcp://{zmq_host}:{pub}", f"tcp://{zmq_host}:{replay}", topic=topic, bind=True
                    )
                )
    except BaseException:
        await asyncio.gather(*(pod.close() for pod in pods))
        raise
    return SimCluster(pods)
