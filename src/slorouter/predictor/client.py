"""The router's side of sidecar mode: a coalescing, failing-over prediction client and a training-sample sink.

``PredictionClient`` gathers the ``predict`` calls made within a short window (1 ms by default) into one
``POST /v1/predict/bulk``, sends it to the ready prediction server with the fewest outstanding requests, fails
over to another server on errors, and raises ``PredictionUnavailable`` when no answer can arrive within the
call's timeout (50 ms by default): the router then routes by its heuristics.

``TrainingSampleSink`` buffers samples in a bounded queue (the oldest are dropped, and counted, when it is
full) and posts them in bulk every second, so a dead training server costs a bounded amount of memory.

``LatencyPredictorBackend`` is the surface the router uses; ``RemotePredictor`` (this module) and
``EmbeddedPredictor`` (``slorouter.predictor.embedded``) both implement it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry, Counter

from slorouter.http.upstream import UpstreamClient, UpstreamError, UpstreamTimeoutError
from slorouter.predictor.features import DEFAULT_SCHEMA, MODEL_KINDS, FeatureSchema, ModelKind, rows_to_matrix

log = logging.getLogger("slorouter.predictor.client")

SERVER_MAX_ROWS = 10_000
_JSON_HEADERS = {"Content-Type": "application/json"}
# The prediction server's optional binary bulk format (docs/predictor-api.md).
BINARY_ROWS_TYPE = "application/vnd.slorouter.rows+f32"
FEATURE_NAMES_HEADER = "X-Feature-Names"


class PredictionUnavailable(Exception):
    """No prediction in time (timeout, no ready server, server errors): route by heuristics instead."""


@runtime_checkable
class LatencyPredictorBackend(Protocol):
    """What the router needs from the latency predictor, embedded or remote."""

    @property
    def ready(self) -> bool:
        """True when predictions can be expected (a trained model is loaded / a server is ready)."""
        ...

    def start(self) -> None:
        """Start background work; call with the event loop running."""
        ...

    async def stop(self) -> None: ...

    async def predict(self, x_ttft: np.ndarray, x_tpot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predicted (TTFT ms, TPOT ms) per row; raises ``PredictionUnavailable`` when there is none.

        TPOT is NaN while only a TTFT model exists (TPOT samples need finished requests, so it comes later).
        """
        ...

    def add_sample(self, kind: ModelKind, row: Mapping[str, float] | np.ndarray, latency_ms: float) -> None:
        """Record an observed latency with the features seen at scheduling time."""
        ...


def check_matrices(x_ttft: np.ndarray, x_tpot: np.ndarray, schema: FeatureSchema = DEFAULT_SCHEMA) -> int:
    """The row count of a (TTFT, TPOT) feature-matrix pair; ``ValueError`` if their shapes do not fit."""
    n_ttft, n_tpot = len(schema.features("ttft")), len(schema.features("tpot"))
    if x_ttft.ndim != 2 or x_ttft.shape[1] != n_ttft:
        raise ValueError(f"x_ttft must have shape (n, {n_ttft}), got {x_ttft.shape}")
    if x_tpot.ndim != 2 or x_tpot.shape[1] != n_tpot:
        raise ValueError(f"x_tpot must have shape (n, {n_tpot}), got {x_tpot.shape}")
    if x_ttft.shape[0] != x_tpot.shape[0]:
        raise ValueError(f"x_ttft has {x_ttft.shape[0]} rows but x_tpot has {x_tpot.shape[0]}")
    return int(x_ttft.shape[0])


class WireFormat:
    """Rows of ``POST /v1/predict/bulk`` for a feature schema: the union of both models' features by name.

    Numbers are written as short as exactness allows, because parsing them is most of the server's JSON cost:
    integral columns (token and request counts) as integers, the others with 9 significant digits, which
    round-trip every float32 value exactly.
    """

    def __init__(self, schema: FeatureSchema = DEFAULT_SCHEMA) -> None:
        ttft, tpot = schema.features("ttft"), schema.features("tpot")
        self.schema = schema
        self.names: tuple[str, ...] = (*ttft, *(n for n in tpot if n not in ttft))
        self._tpot_only = [j for j, n in enumerate(tpot) if n not in ttft]
        self._templates: dict[bytes, str] = {}

    def _template(self, integral: np.ndarray) -> str:
        key = integral.tobytes()
        template = self._templates.get(key)
        if template is None:
            fields = [
                f'"{n}":{"%d" if i else "%.9g"}' for n, i in zip(self.names, integral.tolist(), strict=True)
            ]
            template = self._templates[key] = "{" + ",".join(fields) + "}"
        return template

    def _union(self, x_ttft: np.ndarray, x_tpot: np.ndarray) -> np.ndarray:
        return np.hstack([x_ttft, x_tpot[:, self._tpot_only]]) if self._tpot_only else x_ttft

    def encode(self, x_ttft: np.ndarray, x_tpot: np.ndarray) -> bytes:
        """``{"rows": [...]}``: one JSON object per row keyed by feature name (shared columns from x_ttft)."""
        wire = self._union(x_ttft, x_tpot)
        integral = ((wire == np.rint(wire)) & (np.abs(wire) < 2.0**53)).all(axis=0)
        template = self._template(integral)
        return ('{"rows":[' + ",".join([template % tuple(row) for row in wire.tolist()]) + "]}").encode()

    def encode_binary(self, x_ttft: np.ndarray, x_tpot: np.ndarray) -> bytes:
        """The binary bulk body: the rows as little-endian float32, columns in ``names`` order (sent in the
        ``X-Feature-Names`` header, see ``headers``)."""
        return np.ascontiguousarray(self._union(x_ttft, x_tpot), dtype="<f4").tobytes()

    def headers(self, binary: bool) -> dict[str, str]:
        """The bulk request's headers for the JSON or the binary body."""
        if not binary:
            return dict(_JSON_HEADERS)
        return {"Content-Type": BINARY_ROWS_TYPE, FEATURE_NAMES_HEADER: ",".join(self.names)}


def decode_binary_predictions(body: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """TTFT and TPOT arrays of a binary bulk response: n float64 TTFT values then n TPOT values (NaN when
    there is no TPOT model yet)."""
    if len(body) != 16 * n:
        raise ValueError(f"the server returned {len(body)} bytes for {n} rows; expected {16 * n}")
    values = np.frombuffer(body, dtype="<f8").astype(np.float64)  # a writable copy in native order
    return values[:n], values[n:]


def decode_predictions(body: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """TTFT and TPOT arrays of a bulk response (a null TPOT, sent before a TPOT model exists, is NaN)."""
    predictions = json.loads(body)["predictions"]
    if len(predictions) != n:
        raise ValueError(f"the server returned {len(predictions)} predictions for {n} rows")
    ttft = np.fromiter((p["ttft_ms"] for p in predictions), dtype=np.float64, count=n)
    tpot = np.array([p["tpot_ms"] for p in predictions], dtype=np.float64)  # None becomes NaN
    return ttft, tpot


class TransportError(Exception):
    """The request could not be made or its response not read (connection refused, reset, closed)."""


class _Transport(Protocol):
    async def request(
        self, method: str, url: str, body: bytes, timeout_s: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """Status and body; ``TransportError`` or ``TimeoutError`` otherwise."""
        ...

    async def close(self) -> None: ...


class _LeanTransport:
    """The gateway's lean HTTP/1.1 client (keep-alive pools, httptools): a fraction of aiohttp's CPU and
    latency per request, which matters on the router's event loop."""

    def __init__(self) -> None:
        self._client = UpstreamClient(connect_timeout=1.0, total_timeout=60.0)
        self._raw_headers: dict[tuple[tuple[str, str], ...], bytes] = {}

    def _raw(self, headers: dict[str, str] | None) -> bytes:
        key = tuple((headers or _JSON_HEADERS).items())
        raw = self._raw_headers.get(key)
        if raw is None:
            raw = self._raw_headers[key] = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in key)
        return raw

    async def request(
        self, method: str, url: str, body: bytes, timeout_s: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        parts = urlsplit(url)
        path = parts.path or "/"
        raw_headers = self._raw(headers)
        response = None
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._client.request(parts.netloc, method, path, raw_headers, body)
                payload = await response.read()
        except UpstreamTimeoutError:
            raise TimeoutError from None
        except UpstreamError as exc:
            raise TransportError(str(exc)) from None
        finally:
            if response is not None:
                response.release()  # closes the connection unless the response was complete
        return response.status, payload

    async def close(self) -> None:
        await self._client.close()


class _AiohttpTransport:
    """aiohttp, for https URLs or a caller's own session."""

    def __init__(self, session: aiohttp.ClientSession | None) -> None:
        self._session = session or aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self._own = session is None

    async def request(
        self, method: str, url: str, body: bytes, timeout_s: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        try:
            async with self._session.request(
                method,
                url,
                data=body if method == "POST" else None,
                headers=(headers or _JSON_HEADERS) if method == "POST" else None,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                return response.status, await response.read()
        except TimeoutError:
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        if self._own:
            await self._session.close()


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


@dataclass(eq=False, slots=True)
class _Call:
    x_ttft: np.ndarray
    x_tpot: np.ndarray
    rows: int
    future: asyncio.Future[tuple[np.ndarray, np.ndarray]]
    deadline: float


@dataclass
class ClientStats:
    calls: int = 0
    unavailable: int = 0
    bulk_requests: int = 0
    failovers: int = 0
    rows: int = 0


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


class PredictionClient:
    """Coalescing, least-outstanding, failing-over client of one or more prediction servers."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        coalesce_window_s: float = 0.001,
        timeout_s: float = 0.05,
        max_rows_per_bulk: int = SERVER_MAX_ROWS,
        health_check_interval_s: float = 1.0,
        session: aiohttp.ClientSession | None = None,
        registry: CollectorRegistry | None = None,
        schema: FeatureSchema = DEFAULT_SCHEMA,
        binary: bool = True,
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
        self.wire = WireFormat(schema)
        # The binary bulk format costs a fraction of JSON on both sides; JSON for servers without it.
        self.binary = binary
        self._bulk_headers = self.wire.headers(binary)
        self._encode = self.wire.encode_binary if binary else self.wire.encode
        self._decode = decode_binary_predictions if binary else decode_predictions
        self.coalesce_window_s = coalesce_window_s
        self.timeout_s = timeout_s
        self.max_rows_per_bulk = max_rows_per_bulk
        self.health_check_interval_s = health_check_interval_s
        self.stats = ClientStats()
        self._metrics = _ClientMetrics(registry) if registry is not None else None
        self._session = session
        self._transport: _Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[_Call] = []
        self._pending_rows = 0
        self._flush_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._health_task: asyncio.Task[None] | None = None
        self._probe_now = asyncio.Event()
        self._rotation = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._session is not None or any(s.url.startswith("https://") for s in self.servers):
            self._transport = _AiohttpTransport(self._session)
        else:
            self._transport = _LeanTransport()
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

    # -- prediction ------------------------------------------------------------------------------------------

    async def predict(self, x_ttft: np.ndarray, x_tpot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = check_matrices(x_ttft, x_tpot, self.wire.schema)
        if not (np.isfinite(x_ttft).all() and np.isfinite(x_tpot).all()):
            raise ValueError("feature matrices contain NaN or infinite values")
        loop = self._loop
        if loop is None:
            raise RuntimeError("PredictionClient.start() has not been called")
        self.stats.calls += 1
        if n == 0:
            return np.empty(0), np.empty(0)
        if not any(server.ready is not False for server in self.servers):
            self._probe_now.set()
            return self._unavailable("no ready prediction server")
        future: asyncio.Future[tuple[np.ndarray, np.ndarray]] = loop.create_future()
        self._pending.append(_Call(x_ttft, x_tpot, n, future, loop.time() + self.timeout_s))
        self._pending_rows += n
        if self._pending_rows >= self.max_rows_per_bulk or self.coalesce_window_s == 0:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = loop.call_later(self.coalesce_window_s, self._flush)
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await future
        except TimeoutError:
            return self._unavailable(f"no prediction within {self.timeout_s * 1000:g} ms")
        except PredictionUnavailable as exc:
            return self._unavailable(str(exc))
        if self._metrics:
            self._metrics.calls.labels("ok").inc()
        return result

    def _unavailable(self, reason: str) -> Any:
        self.stats.unavailable += 1
        if self._metrics:
            self._metrics.calls.labels("unavailable").inc()
        raise PredictionUnavailable(reason)

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
        try:
            x_ttft = np.concatenate([c.x_ttft for c in calls]) if len(calls) > 1 else calls[0].x_ttft
            x_tpot = np.concatenate([c.x_tpot for c in calls]) if len(calls) > 1 else calls[0].x_tpot
            deadline = max(c.deadline for c in calls)
            total = x_ttft.shape[0]
            step = self.max_rows_per_bulk
            bodies = [
                (self._encode(x_ttft[i : i + step], x_tpot[i : i + step]), min(step, total - i))
                for i in range(0, total, step)
            ]
            if len(bodies) == 1:
                results = [await self._send(bodies[0][0], bodies[0][1], deadline)]
            else:
                results = await asyncio.gather(*(self._send(body, n, deadline) for body, n in bodies))
        except (Exception, asyncio.CancelledError) as exc:
            reason = (
                "the prediction client is stopping" if isinstance(exc, asyncio.CancelledError) else str(exc)
            )
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(PredictionUnavailable(reason))
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        ttft = np.concatenate([r[0] for r in results]) if len(results) > 1 else results[0][0]
        tpot = np.concatenate([r[1] for r in results]) if len(results) > 1 else results[0][1]
        offset = 0
        for call in calls:
            end = offset + call.rows
            if not call.future.done():
                call.future.set_result((ttft[offset:end], tpot[offset:end]))
            offset = end

    def _pick(self, exclude: set[ServerState]) -> ServerState | None:
        best: ServerState | None = None
        count = len(self.servers)
        self._rotation = (self._rotation + 1) % count
        for i in range(count):
            server = self.servers[(self._rotation + i) % count]
            if server.ready is False or server in exclude:
                continue
            if best is None or server.outstanding < best.outstanding:
                best = server
        return best

    async def _send(self, body: bytes, n: int, deadline: float) -> tuple[np.ndarray, np.ndarray]:
        assert self._loop is not None and self._transport is not None
        tried: set[ServerState] = set()
        last_error = "no ready prediction server"
        while True:
            server = self._pick(tried)
            if server is None:
                self._probe_now.set()
                raise PredictionUnavailable(last_error)
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                raise PredictionUnavailable(f"no prediction within {self.timeout_s * 1000:g} ms")
            if tried:
                self.stats.failovers += 1
            tried.add(server)
            server.outstanding += 1
            server.requests += 1
            self.stats.bulk_requests += 1
            try:
                status, payload = await self._transport.request(
                    "POST", server.url + "/v1/predict/bulk", body, remaining, self._bulk_headers
                )
            except TimeoutError:
                # A slow server is not marked down: its outstanding count already steers traffic away from it.
                self._count(server, "timeout")
                raise PredictionUnavailable(f"no prediction within {self.timeout_s * 1000:g} ms") from None
            except TransportError as exc:
                last_error = f"{server.url}: {exc}"
                self._mark_down(server, last_error, "error")
                continue
            finally:
                server.outstanding -= 1
            if status == 200:
                try:
                    result = self._decode(payload, n)
                except (ValueError, KeyError, TypeError) as exc:
                    last_error = f"{server.url}: malformed response: {exc}"
                    self._mark_down(server, last_error, "error")
                    continue
                server.ready = True
                self.stats.rows += n
                self._count(server, "ok")
                return result
            message = _error_message(payload)
            if status in (400, 413):
                # The rows themselves are refused; another server would refuse them too.
                self._count(server, "rejected")
                raise PredictionUnavailable(f"{server.url} rejected the rows (HTTP {status}): {message}")
            last_error = f"{server.url}: HTTP {status}: {message}"
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

    async def _probe(self, server: ServerState) -> None:
        assert self._transport is not None
        try:
            status, _ = await self._transport.request(
                "GET", server.url + "/readyz", b"", min(1.0, self.health_check_interval_s)
            )
        except (TransportError, TimeoutError) as exc:
            server.ready = False
            server.last_error = f"/readyz: {type(exc).__name__}: {exc}"
            return
        server.ready = status == 200
        if not server.ready:
            server.last_error = f"/readyz: HTTP {status}"


def _error_message(payload: bytes) -> str:
    try:
        return str(json.loads(payload)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return payload[:200].decode(errors="replace")


# -- training samples ----------------------------------------------------------------------------------------


def encode_sample(
    kind: ModelKind,
    row: Mapping[str, float] | np.ndarray,
    latency_ms: float,
    schema: FeatureSchema = DEFAULT_SCHEMA,
) -> str:
    """One sample of ``POST /v1/samples`` as JSON text; ``ValueError`` (or ``FeatureError``) if invalid."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")
    if isinstance(latency_ms, bool) or not math.isfinite(latency_ms) or latency_ms <= 0:
        raise ValueError(f"latency_ms must be a positive finite number, got {latency_ms!r}")
    names = schema.features(kind)
    if isinstance(row, np.ndarray):
        if row.shape != (len(names),):
            raise ValueError(f"a {kind} feature row must have shape ({len(names)},), got {row.shape}")
        row = dict(zip(names, row.tolist(), strict=True))
    # Validated here, one by one: a bad sample in a bulk post would make the server refuse the whole batch.
    values = rows_to_matrix([row], kind, where="row", schema=schema)[0].tolist()
    features = dict(zip(names, values, strict=True))
    return json.dumps(
        {"model": kind, "features": features, "latency_ms": float(latency_ms)}, separators=(",", ":")
    )


@dataclass
class SinkStats:
    added: int = 0
    sent: int = 0
    dropped: int = 0
    rejected: int = 0
    failed_flushes: int = 0


class _SinkMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.samples = Counter(
            "slorouter_training_sink_samples",
            "Training samples by fate: sent, dropped (buffer full), rejected (the server refused them).",
            ["outcome"],
            registry=registry,
        )
        self.failed_flushes = Counter(
            "slorouter_training_sink_failed_flushes",
            "Flushes that failed and will be retried.",
            registry=registry,
        )


@dataclass(eq=False)
class TrainingSampleSink:
    """Buffers training samples and posts them to the training server in bulk every ``flush_interval_s``."""

    url: str
    flush_interval_s: float = 1.0
    max_buffer: int = 50_000
    max_batch: int = 10_000
    timeout_s: float = 10.0
    session: aiohttp.ClientSession | None = None
    registry: CollectorRegistry | None = None
    schema: FeatureSchema = DEFAULT_SCHEMA
    stats: SinkStats = field(default_factory=SinkStats, init=False)

    def __post_init__(self) -> None:
        if self.flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be positive, got {self.flush_interval_s}")
        if self.max_buffer < 1 or self.max_batch < 1:
            raise ValueError("max_buffer and max_batch must be at least 1")
        self.url = self.url.rstrip("/")
        self._buffer: deque[str] = deque(maxlen=self.max_buffer)
        self._own_session = self.session is None
        self._metrics = _SinkMetrics(self.registry) if self.registry is not None else None
        self._task: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self.last_error: str | None = None

    @property
    def dropped(self) -> int:
        return self.stats.dropped

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        self._task = loop.create_task(self._flush_loop(), name="training-sample-sink")

    async def stop(self, *, final_flush_timeout_s: float = 2.0) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.session is not None and self._buffer:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(final_flush_timeout_s):
                    await self.flush()
        if self._own_session and self.session is not None:
            await self.session.close()
            self.session = None

    def add(self, kind: ModelKind, row: Mapping[str, float] | np.ndarray, latency_ms: float) -> None:
        encoded = encode_sample(kind, row, latency_ms, self.schema)
        self.stats.added += 1
        if len(self._buffer) == self.max_buffer:
            self._drop(1)
        self._buffer.append(encoded)

    def _drop(self, n: int) -> None:
        self.stats.dropped += n
        if self._metrics:
            self._metrics.samples.labels("dropped").inc(n)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> bool:
        """Send everything buffered; False if a post failed (its samples go back to the buffer's front)."""
        async with self._flush_lock:
            while self._buffer:
                batch = [self._buffer.popleft() for _ in range(min(self.max_batch, len(self._buffer)))]
                if not await self._post(batch):
                    self._requeue(batch)
                    return False
            return True

    def _requeue(self, batch: list[str]) -> None:
        # Samples added while the post was in flight are newer: keep them, drop the oldest of the batch.
        room = self.max_buffer - len(self._buffer)
        if room < len(batch):
            self._drop(len(batch) - room)
            batch = batch[len(batch) - room :] if room > 0 else []
        self._buffer.extendleft(reversed(batch))

    async def _post(self, batch: list[str]) -> bool:
        assert self.session is not None
        body = ('{"samples":[' + ",".join(batch) + "]}").encode()
        try:
            async with self.session.post(
                self.url + "/v1/samples",
                data=body,
                headers=_JSON_HEADERS,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as response:
                status = response.status
                payload = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return self._failed(f"{type(exc).__name__}: {exc}")
        if status == 202:
            self.stats.sent += len(batch)
            if self._metrics:
                self._metrics.samples.labels("sent").inc(len(batch))
            self.last_error = None
            return True
        if status in (400, 413):
            # Retrying cannot help a refused batch; samples are validated in add(), so this is rare.
            self.stats.rejected += len(batch)
            if self._metrics:
                self._metrics.samples.labels("rejected").inc(len(batch))
            self.last_error = f"HTTP {status}: {_error_message(payload)}"
            log.warning("training server rejected %d samples: %s", len(batch), self.last_error)
            return True
        return self._failed(f"HTTP {status}: {_error_message(payload)}")

    def _failed(self, error: str) -> bool:
        self.stats.failed_flushes += 1
        if self._metrics:
            self._metrics.failed_flushes.inc()
        self.last_error = error
        log.debug("training-sample flush failed: %s", error)
        return False


class RemotePredictor:
    """Sidecar mode: predictions from prediction servers, samples to the training server."""

    def __init__(self, client: PredictionClient, sink: TrainingSampleSink) -> None:
        self.client = client
        self.sink = sink

    @classmethod
    def from_urls(
        cls,
        prediction_urls: Sequence[str],
        training_url: str,
        *,
        registry: CollectorRegistry | None = None,
        **client_options: Any,
    ) -> RemotePredictor:
        return cls(
            PredictionClient(prediction_urls, registry=registry, **client_options),
            TrainingSampleSink(training_url, registry=registry),
        )

    @property
    def ready(self) -> bool:
        return self.client.ready

    def start(self) -> None:
        self.client.start()
        self.sink.start()

    async def stop(self) -> None:
        await self.client.stop()
        await self.sink.stop()

    async def predict(self, x_ttft: np.ndarray, x_tpot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return await self.client.predict(x_ttft, x_tpot)

    def add_sample(self, kind: ModelKind, row: Mapping[str, float] | np.ndarray, latency_ms: float) -> None:
        self.sink.add(kind, row, latency_ms)
