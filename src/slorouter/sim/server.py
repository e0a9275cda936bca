"""Simulated vLLM pods over HTTP: an aiohttp app per pod, its engine stepped in real time.

Each pod runs one ``Engine`` and a driver task: plan a step, sleep its duration, commit it, hand the tokens
to the waiting responses. While the engine stays busy, steps are chained on the ideal time line (a step
starts when the previous one ended, not when the event loop got round to it), so timer overshoot does not
accumulate into the simulated latencies. Many pods share one process and one event loop.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``,
``GET /health``, ``GET /metrics``. Every response carries ``x-sim-pod: <pod name>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from dataclasses import dataclass, field

from aiohttp import web

from slorouter.clock import Clock, MonotonicClock
from slorouter.sim.engine import Engine, Finished, RequestRejected, StepOutput
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
    response_body,
)

logger = logging.getLogger(__name__)

POD_HEADER = "x-sim-pod"
# A step that starts within this long after the previous one ended is chained to it (see module docstring).
_CHAIN_TOLERANCE_S = 0.005
_SHUTDOWN_TIMEOUT_S = 1.0  # grace for responses being written when a pod closes
_MAX_BODY_BYTES = 32 * 1024 * 1024  # a prompt at the context limit must get its 400, not a 413
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


@dataclass(eq=False, slots=True)
class _Active:
    """A request an HTTP handler is waiting on."""

    stream: bool
    handler: asyncio.Task | None = field(default=None, repr=False)
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
        self.name = name
        self.engine = engine
        self.model = model
        self.metrics = PodMetrics(engine, model)
        self._clock = clock or MonotonicClock()
        self._active: dict[int, _Active] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.address = ""
        self.app = web.Application(client_max_size=_MAX_BODY_BYTES)
        self.app.on_response_prepare.append(self._tag_response)
        self.app.add_routes(
            [
                web.post("/v1/completions", self._completions),
                web.post("/v1/chat/completions", self._chat_completions),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.get("/metrics", self._metrics),
            ]
        )

    async def start(self, host: str, port: int) -> str:
        """Serve on ``host:port`` (0: any free port); returns ``host:port`` as bound."""
        self._runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
        )
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, port).start()
        except BaseException:
            await self._runner.cleanup()
            raise
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.address = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        self._driver = asyncio.create_task(self._drive(), name=f"sim-driver-{self.name}")
        return self.address

    async def close(self) -> None:
        """Stop serving: requests in flight are cancelled (and aborted in the engine), then the loop stops."""
        for entry in list(self._active.values()):
            if entry.handler is not None:
                entry.handler.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
            self._driver = None

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
            await asyncio.sleep(max(step.end - clock.now(), 0.0))
            # Zero-length steps (the instant profile) would pin the time line while real time moves on.
            last_end = step.end if step.duration > 0 else -math.inf
            self._deliver(engine.commit_step(step))

    def _deliver(self, output: StepOutput) -> None:
        active = self._active
        for request_id in output.tokens:
            entry = active.get(request_id)
            if entry is not None and entry.stream:
                entry.pending += 1
                entry.wake()
        for event in output.first_tokens:
            self.metrics.first_token(event)
            entry = active.get(event.request_id)
            if entry is not None:
                entry.cached_tokens = event.cached_tokens
        for event in output.finished:
            self.metrics.finished(event)
            entry = active.get(event.request_id)
            if entry is not None:
                entry.finished = event
                entry.wake()

    # ---------------------------------------------------------------------------------------- handlers

    async def _tag_response(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[POD_HEADER] = self.name

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            parsed = parse_generation(
                parse_json(await request.read()),
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
            return web.json_response(exc.body(), status=exc.status)
        entry = _Active(stream=parsed.stream, handler=asyncio.current_task())
        self._active[engine_id] = entry
        self._wake.set()
        try:
            if parsed.stream:
                return await self._stream(request, parsed, entry)
            while entry.finished is None:
                await entry.wait()
            await self._sleep_until(entry.finished.done_time)
            body = response_body(
                parsed, new_request_id(chat), created_now(), entry.finished.output_tokens, entry.cached_tokens
            )
            return web.json_response(body)
        finally:
            del self._active[engine_id]
            if entry.finished is None:  # the client went away (or the pod is closing)
                self.engine.abort(engine_id)

    async def _stream(
        self, request: web.Request, parsed: GenerationRequest, entry: _Active
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        writer = SseWriter(parsed, new_request_id(parsed.chat), created_now())
        try:
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
        return response

    async def _sleep_until(self, deadline: float) -> None:
        delay = deadline - self._clock.now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": created_now(),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.engine.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})


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
) -> SimCluster:
    """Start ``count`` pods on ports ``port``..``port+count-1`` (``port=0``: a free port each).

    Pod ``i`` is named ``sim-<its port>``, seeds its engine with ``seed + i`` and serves ``model`` (default:
    the profile's model name). Raises ``ValueError`` for a bad count, port or profile and ``OSError`` when a
    port cannot be bound (pods already started are closed first).
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
    except BaseException:
        await asyncio.gather(*(pod.close() for pod in pods))
        raise
    return SimCluster(pods)
