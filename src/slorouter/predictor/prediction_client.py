"""The router's side of sidecar mode: a coalescing, failing-over client of the prediction servers.

``PredictionClient`` gathers the ``predict`` calls made within a short window (1 ms by default) into one
``POST /v1/predict/bulk``, sends it to the ready prediction server with the fewest outstanding requests, fails
over to another server on errors, and raises ``PredictionUnavailable`` when no answer can arrive within the
call's timeout (50 ms by default): the router then routes by its heuristics. A health loop probes every
server's ``/readyz`` each second, and at once after an error. A circuit breaker
(``slorouter.predictor.breaker``) stops the calls while the servers keep failing or are slow, so requests go
by the fallback at once instead of each waiting for the timeout, and lets one call through as a probe after
a cool-down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from slorouter.http.auth import bearer_header
from slorouter.predictor.backend import PredictionUnavailable
from slorouter.predictor.breaker import BreakerConfig, BreakerState, CircuitBreaker
from slorouter.predictor.features import DEFAULT_SCHEMA, FeatureSchema
from slorouter.predictor.transport import AiohttpTransport, LeanTransport, Transport, TransportError
from slorouter.predictor.wire import (
    BULK_PATH,
    MAX_ROWS,
    RowEncoder,
    check_predictions,
    decode_binary_predictions,
    decode_predictions,
    error_message,
    model_versions_in,
)

log = logging.getLogger("slorouter.predictor.prediction_client")


@dataclass(eq=False)
class ServerState:
    """One prediction server as the client sees it."""

    url: str
    # None until the first probe or request; False after an error or a failed probe, until a probe succeeds.
    ready: bool | None = None
    outstanding: int = 0
    requests: int = 0
    errors: int = 0
    last_error: str | None = None
    refused_token: bool = False  # it answered 401/403 (warned once)
    versions: dict[str, str] = field(default_factory=dict)  # the model versions its /readyz says it serves
    stale: bool = False  # serves a model superseded stale_after_s ago: predictions go to current servers


@dataclass(eq=False, slots=True)
class _Call:
    x_all: np.ndarray
    rows: int
    future: asyncio.Future[tuple[np.ndarray, np.ndarray]]
    deadline: float
    epoch: int  # the breaker's, when the call was admitted


@dataclass
class ClientStats:
    calls: int = 0
    unavailable: int = 0
    bulk_requests: int = 0
    failovers: int = 0
    rows: int = 0
    breaker_rejections: int = 0  # calls refused at once because the breaker was open


class _ClientMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "slorouter_prediction_client_calls", "predict() calls by outcome.", ["outcome"], registry=registry
        )
        self.bulk = Counter(
            "slorouter_prediction_client_bulk_requests",
            "Bulk requests sent, by server and outcome.",
            ["server", "outcome"],
            registry=registry,
        )
        self.breaker_state = Gauge(
            "slorouter_prediction_breaker_state",
            "The prediction client's circuit breaker: 1 for its current state, 0 for the others.",
            ["state"],
            registry=registry,
        )
        self.stale = Gauge(
            "slorouter_prediction_server_stale",
            "1 while a prediction server serves other model versions than the training server publishes "
            "(for longer than the client's stale_after_s).",
            ["server"],
            registry=registry,
        )
        self.breaker_transitions = Counter(
            "slorouter_prediction_breaker_transitions",
            "Circuit-breaker transitions, by the state entered.",
            ["state"],
            registry=registry,
        )
        self.set_breaker_state(BreakerState.CLOSED)

    def set_breaker_state(self, state: BreakerState) -> None:
        for each in BreakerState:
            self.breaker_state.labels(each.value).set(1 if each is state else 0)


class PredictionClient:
    """Coalescing, least-outstanding, failing-over client of one or more prediction servers."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        coalesce_window_s: float = 0.001,
        timeout_s: float = 0.05,
        max_rows_per_bulk: int = MAX_ROWS,
        health_check_interval_s: float = 1.0,
        session: aiohttp.ClientSession | None = None,
        registry: CollectorRegistry | None = None,
        schema: FeatureSchema = DEFAULT_SCHEMA,
        binary: bool = True,
        tokens: Sequence[str] = (),
        breaker: BreakerConfig | None = None,
        stale_after_s: float = 30.0,
    ) -> None:
        if not urls:
            raise ValueError("at least one prediction-server URL is required")
        if coalesce_window_s < 0:
            raise ValueError(f"coalesce_window_s must be >= 0, got {coalesce_window_s}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if max_rows_per_bulk < 1:
            raise ValueError(f"max_rows_per_bulk must be at least 1, got {max_rows_per_bulk}")
        if health_check_interval_s <= 0:
            raise ValueError(f"health_check_interval_s must be positive, got {health_check_interval_s}")
        self.servers = [ServerState(url.rstrip("/")) for url in urls]
        self.wire = RowEncoder(schema)
        # The binary bulk format costs a fraction of JSON on both sides; JSON for servers without it.
        self.binary = binary
        self._auth = bearer_header(tokens)
        self._bulk_headers = {**self.wire.headers(binary), **self._auth}
        self._encode = self.wire.encode_binary if binary else self.wire.encode
        self._decode = decode_binary_predictions if binary else decode_predictions
        self.coalesce_window_s = coalesce_window_s
        self.timeout_s = timeout_s
        self.max_rows_per_bulk = max_rows_per_bulk
        self.health_check_interval_s = health_check_interval_s
        # The model versions the training server publishes (``RemotePredictor`` gives its sink's); a server
        # serving others for stale_after_s is stale (``check_versions``).
        self.published_versions: Callable[[], Mapping[str, str]] = dict
        self.stale_after_s = stale_after_s
        # (kind, version): when last seen published, or first seen served if never seen published
        self._current_at: dict[tuple[str, str], float] = {}
        self.stats = ClientStats()
        self._metrics = _ClientMetrics(registry) if registry is not None else None
        self._session = session
        self._transport: Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[_Call] = []
        self._pending_rows = 0
        self._flush_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._health_task: asyncio.Task[None] | None = None
        self._probe_now = asyncio.Event()
        self._rotation = 0
        # By default the latency budget is the timeout: the breaker opens when over 1% of calls time out.
        self.breaker = CircuitBreaker(
            breaker or BreakerConfig(latency_budget_s=timeout_s, probe_timeout_s=max(1.0, 2 * timeout_s)),
            self._now,
            self._breaker_moved,
        )

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._session is not None or any(s.url.startswith("https://") for s in self.servers):
            self._transport = AiohttpTransport(self._session)
        else:
            self._transport = LeanTransport()
        self._health_task = self._loop.create_task(self._health_loop(), name="prediction-client-health")

    async def stop(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for call in self._pending:
            if not call.future.done():
                call.future.set_exception(PredictionUnavailable("the prediction client is stopping"))
        self._pending = []
        self._pending_rows = 0
        tasks = [t for t in (self._health_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._health_task = None
        if self._transport is not None:
            await self._transport.close()
            self._transport = None
        self._loop = None

    @property
    def ready(self) -> bool:
        return any(server.ready for server in self.servers)

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    def _breaker_moved(self, old: BreakerState, new: BreakerState, reason: str) -> None:
        log_level = logging.INFO if new is BreakerState.HALF_OPEN else logging.WARNING
        log.log(log_level, "prediction circuit breaker %s -> %s: %s", old, new, reason)
        if self._metrics:
            self._metrics.set_breaker_state(new)
            self._metrics.breaker_transitions.labels(new.value).inc()

    # -- prediction ------------------------------------------------------------------------------------------

    async def predict(self, x_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predicted (TTFT ms, TPOT ms) per row of the union matrix (``schema.all_features()`` columns)."""
        width = len(self.wire.schema.all_features())
        if x_all.ndim != 2 or x_all.shape[1] != width:
            raise ValueError(f"rows must have {width} features, got shape {x_all.shape}")
        if not np.isfinite(x_all).all():
            raise ValueError("the feature matrix contains NaN or infinite values")
        n = x_all.shape[0]
        loop = self._loop
        if loop is None:
            raise RuntimeError("PredictionClient.start() has not been called")
        self.stats.calls += 1
        if n == 0:
            return np.empty(0), np.empty(0)
        epoch = self.breaker.admit()
        if epoch is None:
            self.stats.breaker_rejections += 1
            self._unavailable(
                f"the circuit breaker is open ({self.breaker.last_reason})", "breaker-open", "breaker_open"
            )
        if not any(server.ready is not False for server in self.servers):
            self._probe_now.set()
            if self.breaker.state is BreakerState.HALF_OPEN:
                self.breaker.release(epoch)  # the probe is for a server: wait for one to be ready
            else:
                self.breaker.record(epoch, False)
            self._unavailable("no ready prediction server", "no-ready-server")
        future: asyncio.Future[tuple[np.ndarray, np.ndarray]] = loop.create_future()
        self._pending.append(_Call(x_all, n, future, loop.time() + self.timeout_s, epoch))
        self._pending_rows += n
        if self._pending_rows >= self.max_rows_per_bulk or self.coalesce_window_s == 0:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = loop.call_later(self.coalesce_window_s, self._flush)
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await future
        except TimeoutError:
            self._unavailable(f"no prediction within {self.timeout_s * 1000:g} ms", "timeout")
        except PredictionUnavailable as exc:
            self._unavailable(str(exc), exc.reason)
        if self._metrics:
            self._metrics.calls.labels("ok").inc()
        return result

    def _unavailable(self, message: str, reason: str, outcome: str = "unavailable") -> NoReturn:
        self.stats.unavailable += 1
        if self._metrics:
            self._metrics.calls.labels(outcome).inc()
        raise PredictionUnavailable(message, reason)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        calls, self._pending, self._pending_rows = self._pending, [], 0
        if not calls:
            return
        assert self._loop is not None
        task = self._loop.create_task(self._dispatch(calls))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dispatch(self, calls: list[_Call]) -> None:
        assert self._loop is not None
        started = self._loop.time()
        epoch = max(c.epoch for c in calls)
        try:
            x_all = np.concatenate([c.x_all for c in calls]) if len(calls) > 1 else calls[0].x_all
            deadline = max(c.deadline for c in calls)
            total = x_all.shape[0]
            step = self.max_rows_per_bulk
            bodies = [
                (self._encode(x_all[i : i + step]), min(step, total - i)) for i in range(0, total, step)
            ]
            if len(bodies) == 1:
                results = [await self._send(bodies[0][0], bodies[0][1], deadline)]
            else:
                results = await asyncio.gather(*(self._send(body, n, deadline) for body, n in bodies))
        except (Exception, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError):
                error = PredictionUnavailable("the prediction client is stopping", "stopping")
            elif isinstance(exc, PredictionUnavailable):
                error = exc
                # A timed-out exchange is slower than any budget; an error answer says nothing of speed.
                self.breaker.record(epoch, False, math.inf if exc.reason == "timeout" else None)
            else:
                error = PredictionUnavailable(str(exc))
                self.breaker.record(epoch, False)
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(PredictionUnavailable(str(error), error.reason))
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.breaker.record(epoch, True, self._loop.time() - started)
        ttft = np.concatenate([r[0] for r in results]) if len(results) > 1 else results[0][0]
        tpot = np.concatenate([r[1] for r in results]) if len(results) > 1 else results[0][1]
        offset = 0
        for call in calls:
            end = offset + call.rows
            if not call.future.done():
                call.future.set_result((ttft[offset:end], tpot[offset:end]))
            offset = end

    def _pick(self, exclude: set[ServerState]) -> ServerState | None:
        """The least-outstanding ready server not tried yet, a current one before a stale one."""
        best: ServerState | None = None
        count = len(self.servers)
        self._rotation = (self._rotation + 1) % count
        for i in range(count):
            server = self.servers[(self._rotation + i) % count]
            if server.ready is False or server in exclude:
                continue
            if best is None or (server.stale, server.outstanding) < (best.stale, best.outstanding):
                best = server
        return best

    async def _send(self, body: bytes, n: int, deadline: float) -> tuple[np.ndarray, np.ndarray]:
        assert self._loop is not None and self._transport is not None
        tried: set[ServerState] = set()
        last_error, last_reason = "no ready prediction server", "no-ready-server"
        while True:
            server = self._pick(tried)
            if server is None:
                self._probe_now.set()
                raise PredictionUnavailable(last_error, last_reason)
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                raise PredictionUnavailable(f"no prediction within {self.timeout_s * 1000:g} ms", "timeout")
            if tried:
                self.stats.failovers += 1
            tried.add(server)
            server.outstanding += 1
            server.requests += 1
            self.stats.bulk_requests += 1
            try:
                status, payload = await self._transport.request(
                    "POST", server.url + BULK_PATH, body, remaining, self._bulk_headers
                )
            except TimeoutError:
                # A slow server is not marked down: its outstanding count already steers traffic away from it.
                self._count(server, "timeout")
                raise PredictionUnavailable(
                    f"no prediction within {self.timeout_s * 1000:g} ms", "timeout"
                ) from None
            except TransportError as exc:
                last_error, last_reason = f"{server.url}: {exc}", "unreachable"
                self._mark_down(server, last_error, "error")
                continue
            finally:
                server.outstanding -= 1
            if status == 200:
                try:
                    result = self._decode(payload, n)
                    check_predictions(*result)
                except (ValueError, KeyError, TypeError) as exc:
                    last_error, last_reason = f"{server.url}: malformed response: {exc}", "malformed"
                    self._mark_down(server, last_error, "malformed")
                    continue
                server.ready = True
                self.stats.rows += n
                self._count(server, "ok")
                return result
            message = error_message(payload)
            if status in (400, 413):
                # The rows themselves are refused; another server would refuse them too.
                self._count(server, "rejected")
                raise PredictionUnavailable(
                    f"{server.url} rejected the rows (HTTP {status}): {message}", "rejected"
                )
            if status in (401, 403):
                # A configuration error, not a fault: its /readyz (open to probes) says ready, so without a
                # word the server would only flap between down and ready.
                last_error, last_reason = f"{server.url}: HTTP {status}: {message}", "unauthorized"
                if not server.refused_token:
                    server.refused_token = True
                    log.warning(
                        "prediction server %s refused this router's token (HTTP %d): set "
                        "predictor.remote.token_file or token_env to the servers' token",
                        server.url,
                        status,
                    )
                self._mark_down(server, last_error, "unauthorized")
                continue
            last_error, last_reason = f"{server.url}: HTTP {status}: {message}", "server-error"
            self._mark_down(server, last_error, "not_ready" if status == 503 else "error")

    def _count(self, server: ServerState, outcome: str) -> None:
        if self._metrics:
            self._metrics.bulk.labels(server.url, outcome).inc()

    def _mark_down(self, server: ServerState, error: str, outcome: str) -> None:
        server.ready = False
        server.errors += 1
        server.last_error = error
        self._count(server, outcome)
        self._probe_now.set()
        log.debug("prediction server marked down: %s", error)

    # -- health ----------------------------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        min_gap = min(self.health_check_interval_s, 0.05)
        while True:
            self._probe_now.clear()
            await self.probe()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.health_check_interval_s):
                    await self._probe_now.wait()
            await asyncio.sleep(min_gap)

    async def probe(self) -> None:
        """Probe every server's ``/readyz`` once and update its state."""
        await asyncio.gather(*(self._probe(server) for server in self.servers))
        self.check_versions()

    def check_versions(self) -> None:
        """Compare each ready server's model versions with the training server's (``published_versions``):
        a server serving a model the training server superseded ``stale_after_s`` ago or longer (one this
        client never saw published counts from when it first saw it served: the trainer may publish and
        supersede a version between two checks) is stale: logged once, ``slorouter_prediction_server_stale``,
        and it gets predictions only when no current server is ready, until it catches up. A server that
        reloads within ``stale_after_s`` of each publication never is."""
        published = self.published_versions()
        now = self._now()
        current_at = self._current_at
        for kind, version in published.items():
            current_at[kind, version] = now
        served = {(kind, s.versions.get(kind, "")) for s in self.servers if s.ready for kind in published}
        for key in served:
            current_at.setdefault(key, now)
        for server in self.servers:
            superseded = [
                kind
                for kind, version in published.items()
                if server.ready
                and server.versions.get(kind) != version
                and now - current_at[kind, server.versions.get(kind, "")] >= self.stale_after_s
            ]
            if not superseded:
                if server.stale:
                    log.info("prediction server %s serves the published models again", server.url)
                server.stale = False
            elif not server.stale:
                server.stale = True
                log.warning(
                    "prediction server %s serves models %s, superseded by the published %s over %.0f s ago: "
                    "predictions go to the servers that serve them",
                    server.url,
                    server.versions,
                    published,
                    self.stale_after_s,
                )
            if self._metrics is not None:
                self._metrics.stale.labels(server.url).set(1 if server.stale else 0)
        for key in [k for k in current_at if k not in served and published.get(k[0]) != k[1]]:
            del current_at[key]  # neither served nor published: nothing to judge by it

    async def _probe(self, server: ServerState) -> None:
        assert self._transport is not None
        try:
            status, payload = await self._transport.request(
                "GET", server.url + "/readyz", b"", min(1.0, self.health_check_interval_s), self._auth or None
            )
        except (TransportError, TimeoutError) as exc:
            server.ready = False
            server.last_error = f"/readyz: {type(exc).__name__}: {exc}"
            return
        server.versions = model_versions_in(payload) or {}
        server.ready = status == 200
        if not server.ready:
            server.last_error = f"/readyz: HTTP {status}"
