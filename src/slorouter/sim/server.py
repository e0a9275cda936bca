"""Simulated vLLM pods over HTTP: one lean HTTP/1.1 server per pod, its engine stepped in real time.

Each pod runs one ``Engine`` and a driver task: plan a step, sleep its duration, commit it, hand the tokens
to the waiting responses. While the engine stays busy, steps are chained on the ideal time line (a step
starts when the previous one ended, not when the event loop got round to it), so timer overshoot does not
accumulate into the simulated latencies. Many pods share one process and one event loop.

The HTTP front-end is the gateway's own server (``slorouter.http.server``: asyncio.Protocol + httptools),
which costs a fraction of aiohttp's CPU per request; the simulated pods share the router's cores in every
benchmark, so their overhead is the benchmark's noise.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``,
``GET /health``, ``GET /metrics``. Every response carries ``x-sim-pod: <pod name>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from slorouter.clock import Clock, MonotonicClock
from slorouter.http.server import HttpRequest, HttpServer, Response
from slorouter.kvevents.publisher import ZmqEventPublisher
from slorouter.sim.engine import Engine, Finished, RequestId, RequestRejected, StepOutput
from slorouter.sim.kv_events import PodKVEvents
from slorouter.sim.metrics import CONTENT_TYPE, PodMetrics
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


def _zero_cost(profile: Profile) -> bool:
    """True for a profile whose steps and API overheads all take no time (the ``instant`` profile)."""
    p = profile
    costs = (p.w_ms, p.c_lin_ms, p.c_attn_ms, p.c_kv_ms, p.c_req_ms, p.c_step_ms)
    return not any(costs) and not any((p.api_pre_ms, p.api_post_ms, p.api_per_token_ms))


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

    def __init__(self, name: str, engine: Engine, model: str, clock: Clock | None = None) -> None:
        self.engine = engine
        self.model = model
        self.metrics = PodMetrics(engine, model)
        self._late_gauges = self.metrics.gauges.delayed  # sample the gauges at every step (gauges.py)
        self._clock = clock or MonotonicClock()
        self._active: dict[RequestId, _Active] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._zero_cost = _zero_cost(engine.profile)
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
        self.kv_events = PodKVEvents(self.engine, publisher)
        publisher.start()

    async def close(self) -> None:
        """Stop serving: requests in flight are cancelled (and aborted in the engine), then the loop stops."""
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
            await self.kv_events.publisher.close()

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
            )
            engine_id = next(self._ids)
            try:
                self.engine.add_request(engine_id, parsed.prompt_ids, parsed.max_tokens, self._clock.now())
            except RequestRejected as exc:
                raise ApiError(str(exc)) from None
        except ApiError as exc:
            return _json_response(exc.body(), status=exc.status)
        entry = _Active(stream=parsed.stream, handler=asyncio.current_task())
        self._active[engine_id] = entry
        if not self._zero_cost:
            self._wake.set()
        elif not self._step_soon:
            self._step_soon = True
            asyncio.get_running_loop().call_soon(self._step_now)
        try:
            if parsed.stream:
                await self._stream(request, parsed, entry)
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

    async def _stream(self, request: HttpRequest, parsed: GenerationRequest, entry: _Active) -> None:
        try:
            response = await request.start_stream(200, _SSE_HEADERS)
            writer = SseWriter(parsed, new_request_id(parsed.chat), created_now())
            while True:
                if entry.pending:
                    count, entry.pending = entry.pending, 0
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
        page = self.metrics.render(self._clock.now())
        return Response(body=page.encode(), content_type=CONTENT_TYPE.encode())


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
) -> SimCluster:
    """Start ``count`` pods on ports ``port``..``port+count-1`` (``port=0``: a free port each).

    Pod ``i`` is named ``sim-<its port>``, seeds its engine with ``seed + i`` and serves ``model`` (default:
    the profile's model name). With ``kv_events_port`` pod ``i`` publishes its KV events on
    ``tcp://host:kv_events_port + 2i`` and answers replay on the next port (0: free ports), with topic
    ``kv_events_topic`` (default ``kv@<host:port>@<model>``, as llm-d-inference-sim). Raises ``ValueError``
    for a bad count, port or profile and ``OSError`` (``zmq.ZMQError`` for a KV-event port) when a port
    cannot be bound (pods already started are closed first).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if not 0 <= port <= 65535 or (port and port + count - 1 > 65535):
        raise ValueError(f"ports {port}..{port + count - 1} are not all valid TCP ports")
    resolved = get_profile(profile) if isinstance(profile, str) else profile
    pods: list[SimPod] = []
    try:
        for index in range(count):
            engine = Engine(resolved, seed=seed + index, jitter_sigma=jitter_sigma)
            pod = SimPod("", engine, model or resolved.model)
            await pod.start(host, port + index if port else 0)
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
