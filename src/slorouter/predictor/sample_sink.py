"""The router's training-sample sink in sidecar mode.

``TrainingSampleSink`` buffers samples in a bounded queue (the oldest are dropped, and counted, when it is
full) and posts them in bulk to the training server's ``POST /v1/samples`` every second, so a dead training
server costs a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from slorouter.http.auth import bearer_header
from slorouter.predictor.features import DEFAULT_SCHEMA, MODEL_KINDS, FeatureSchema, ModelKind, rows_to_matrix
from slorouter.predictor.pool_shape import PoolShape
from slorouter.predictor.wire import JSON_TYPE, error_message, model_versions_in

log = logging.getLogger("slorouter.predictor.sample_sink")


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
    def __init__(self, registry: CollectorRegistry, buffered: Callable[[], int]) -> None:
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
        self.buffered = Gauge(
            "slorouter_training_sink_buffered_samples",
            "Samples held for the training server: queued (at most max_buffered_samples) or being posted.",
            registry=registry,
        )
        self.buffered.set_function(buffered)


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
    pool_shape: Callable[[], PoolShape] | None = None  # the router's pool, declared with every post
    tokens: Sequence[str] = field(default=(), repr=False)  # the training server's: the first is sent
    stats: SinkStats = field(default_factory=SinkStats, init=False)

    def __post_init__(self) -> None:
        if self.flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be positive, got {self.flush_interval_s}")
        if self.max_buffer < 1 or self.max_batch < 1:
            raise ValueError("max_buffer and max_batch must be at least 1")
        self.url = self.url.rstrip("/")
        self._headers = {"Content-Type": JSON_TYPE, **bearer_header(self.tokens)}
        self._buffer: deque[str] = deque(maxlen=self.max_buffer)
        self._own_session = self.session is None
        self._metrics = _SinkMetrics(self.registry, lambda: self.held) if self.registry is not None else None
        self._task: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._posting = 0  # samples of the batch being posted (out of the queue, not yet delivered)
        self.last_error: str | None = None
        self.published_versions: dict[str, str] = {}  # per kind, the training server's latest answer
        self._retrain: set[ModelKind] = set()  # kinds to ask a retrain of with the next batch

    @property
    def dropped(self) -> int:
        return self.stats.dropped

    @property
    def buffered(self) -> int:
        """Samples queued, not counting the batch being posted."""
        return len(self._buffer)

    @property
    def held(self) -> int:
        """Samples not yet delivered nor dropped: queued, or in the batch being posted."""
        return len(self._buffer) + self._posting

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
        if self._buffer:
            log.warning(
                "%d training samples not delivered at shutdown (%s)", len(self._buffer), self.last_error
            )
            self._drop(len(self._buffer))
            self._buffer.clear()
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
        if self.pool_shape is not None:
            await self._post([])  # declare the pool at once: the training server checks its saved state
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> bool:
        """Send everything buffered; False if a post failed (its samples go back to the buffer's front)."""
        async with self._flush_lock:
            while self._buffer:
                batch = [self._buffer.popleft() for _ in range(min(self.max_batch, len(self._buffer)))]
                self._posting = len(batch)
                try:
                    posted = await self._post(batch)
                except asyncio.CancelledError:
                    self._requeue(batch)  # stop() tries them once more, then counts what is left
                    raise
                finally:
                    self._posting = 0
                if not posted:
                    self._requeue(batch)
                    return False
            return True

    def request_retrain(self, kind: ModelKind) -> None:
        """Ask the training server to retrain ``kind`` at once, with the next batch of samples."""
        self._retrain.add(kind)

    def _requeue(self, batch: list[str]) -> None:
        # Samples added while the post was in flight are newer: keep them, drop the oldest of the batch.
        room = self.max_buffer - len(self._buffer)
        if room < len(batch):
            self._drop(len(batch) - room)
            batch = batch[len(batch) - room :] if room > 0 else []
        self._buffer.extendleft(reversed(batch))

    async def _post(self, batch: list[str]) -> bool:
        assert self.session is not None
        head: dict[str, Any] = {"schema": self.schema.key()}
        if self.pool_shape is not None:
            head["pool_shape"] = self.pool_shape().to_dict()
        retrain = sorted(self._retrain)
        if retrain:
            head["retrain"] = retrain
        body = (
            json.dumps(head, separators=(",", ":"))[:-1] + ',"samples":[' + ",".join(batch) + "]}"
        ).encode()
        try:
            async with self.session.post(
                self.url + "/v1/samples",
                data=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as response:
                status = response.status
                payload = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return self._failed(f"{type(exc).__name__}: {exc}")
        if status == 202:
            self._retrain.difference_update(retrain)
            self.published_versions = published_versions_in(payload, self.published_versions)
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
            self.last_error = f"HTTP {status}: {error_message(payload)}"
            log.warning("training server rejected %d samples: %s", len(batch), self.last_error)
            return True
        return self._failed(f"HTTP {status}: {error_message(payload)}")

    def _failed(self, error: str) -> bool:
        self.stats.failed_flushes += 1
        if self._metrics:
            self._metrics.failed_flushes.inc()
        self.last_error = error
        log.debug("training-sample flush failed: %s", error)
        return False


def published_versions_in(payload: bytes, before: dict[str, str]) -> dict[str, str]:
    """The model versions the training server says it publishes (its answer to a batch of samples); the
    ones known ``before`` when the answer does not say (an older training server)."""
    versions = model_versions_in(payload)
    return before if versions is None else versions
