"""The training server: ingests latency samples, retrains on a cadence, publishes models.

Ingestion is all-or-nothing per request: every sample is validated first, and one bad sample rejects the
request with a 400 naming it (``samples[3].features.kv_cache_percentage: ...``). Training runs in one
background thread (never on the event loop, never two at once) and writes each model atomically into the
model directory, from which ``GET /v1/models/{kind}`` serves the model file with its version as the ETag.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slorouter.clock import Clock, MonotonicClock
from slorouter.http.auth import BearerTokens, aiohttp_auth_middleware, check_bind
from slorouter.http.errors import RequestError, error_response
from slorouter.http.headers import parse_etags
from slorouter.http.json_bodies import json_response, read_json, request_error_response
from slorouter.http.probes import healthz, metrics_handler, readyz_handler
from slorouter.http.running import RunningServer, listen
from slorouter.predictor.features import (
    MODEL_KINDS,
    FeatureError,
    FeatureSchema,
    ModelKind,
    check_kind,
    rows_to_matrix,
)
from slorouter.predictor.model_store import ModelMetadata, ModelStore, decode_model_file
from slorouter.predictor.pool_shape import PoolShape, PoolShapeMismatchError
from slorouter.predictor.sample_schema import check_sample_schema
from slorouter.predictor.state_dir import DEFAULT_MAX_AGE_S, SAMPLE_WINDOW, StateDirLock
from slorouter.predictor.store import SampleStore, StoreConfig
from slorouter.predictor.trainer import Trainer, TrainerConfig, TrainingReport
from slorouter.predictor.warm_start import StatePersistence, refusal_counter

log = logging.getLogger("slorouter.predictor.training_server")

MAX_SAMPLES_PER_REQUEST = 100_000
MAX_BODY_BYTES = 64 * 1024 * 1024
MODEL_METADATA_HEADER = "X-Model-Metadata"
MODEL_CONTENT_TYPE = "application/vnd.slorouter.model"
OPEN_PATHS = frozenset({"/healthz", "/readyz"})

Parsed = dict[ModelKind, tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True, slots=True)
class SampleBatch:
    rows: Parsed  # per model kind, its feature matrix and latencies (ms)
    pool_shape: PoolShape | None  # the pool the samples come from, when the sender says
    retrain: tuple[ModelKind, ...] = ()  # kinds the sender asks to retrain at once (its ledger saw drift)


def parse_samples(
    data: Any, *, max_samples: int = MAX_SAMPLES_PER_REQUEST, schema: FeatureSchema
) -> SampleBatch:
    """Validate a ``POST /v1/samples`` body: its feature schema (which must be ``schema``, see
    ``sample_schema``), its pool shape (optional) and its samples.

    Raises ``RequestError`` naming the first bad member or sample, before anything is returned (so before
    anything is stored).
    """
    if not isinstance(data, dict):
        raise RequestError('body must be a JSON object {"schema": {...}, "samples": [...]}')
    check_sample_schema(data.get("schema"), schema)
    pool_shape = None
    if data.get("pool_shape") is not None:
        shape = data["pool_shape"]
        try:
            pool_shape = PoolShape.from_dict(shape if isinstance(shape, dict) else {})
        except ValueError as exc:
            raise RequestError(f'"pool_shape": {exc}', param="pool_shape") from None
    retrain = data.get("retrain", [])
    if not isinstance(retrain, list) or not all(isinstance(k, str) and k in MODEL_KINDS for k in retrain):
        raise RequestError(
            f'"retrain": must be a list of model kinds ({", ".join(MODEL_KINDS)}), got {retrain!r:.100}',
            param="retrain",
        )
    samples = data.get("samples")
    if not isinstance(samples, list):
        raise RequestError('"samples" must be a list', param="samples")
    if len(samples) > max_samples:
        raise RequestError(
            f'"samples" holds {len(samples)} samples; at most {max_samples} are allowed per request',
            param="samples",
            status=413,
        )
    rows: dict[ModelKind, list[Any]] = {kind: [] for kind in MODEL_KINDS}
    latencies: dict[ModelKind, list[float]] = {kind: [] for kind in MODEL_KINDS}
    indices: dict[ModelKind, list[int]] = {kind: [] for kind in MODEL_KINDS}
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise RequestError(
                f"samples[{i}]: must be an object with model, features and latency_ms", param=f"samples[{i}]"
            )
        kind = sample.get("model")
        if not isinstance(kind, str) or kind not in rows:  # (a dict or list is not hashable)
            raise RequestError(
                f"samples[{i}].model: must be one of {', '.join(map(repr, MODEL_KINDS))}, got {kind!r}",
                param=f"samples[{i}].model",
            )
        features = sample.get("features")
        if not isinstance(features, dict):
            raise RequestError(
                f"samples[{i}].features: must be an object of feature values", param=f"samples[{i}].features"
            )
        latency = sample.get("latency_ms")
        if isinstance(latency, bool) or not isinstance(latency, int | float) or not 0 < latency < math.inf:
            raise RequestError(
                f"samples[{i}].latency_ms: must be a positive finite number, got {latency!r}",
                param=f"samples[{i}].latency_ms",
            )
        rows[kind].append(features)
        latencies[kind].append(float(latency))
        indices[kind].append(i)
    parsed: Parsed = {}
    for kind in MODEL_KINDS:
        if not rows[kind]:
            continue
        try:
            matrix = rows_to_matrix(
                rows[kind], kind, where="samples[{i}].features", indices=indices[kind], schema=schema
            )
        except FeatureError as exc:
            param = f"samples[{exc.index}].features" if exc.index is not None else "samples"
            raise RequestError(str(exc), param=param) from None
        parsed[kind] = (matrix, np.asarray(latencies[kind], dtype=np.float64))
    return SampleBatch(parsed, pool_shape, tuple(retrain))


@dataclass(frozen=True, slots=True)
class _PublishedModel:
    version: str
    data: bytes  # the model file: metadata header + booster, checksummed (model_store.encode_model_file)
    metadata_json: str


@dataclass
class _Metrics:
    received: Counter
    rejected: Counter
    rejected_requests: Counter
    trainings: Counter
    training_duration: Histogram
    model_version: Gauge
    holdout_mape: Gauge
    holdout_coverage: Gauge
    stored: Gauge
    model_requests: Counter
    refused: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> _Metrics:
        return cls(
            received=Counter(
                "slorouter_training_samples_received", "Samples accepted.", ["model"], registry=registry
            ),
            rejected=Counter(
                "slorouter_training_samples_rejected",
                "Samples in requests refused by validation (a bad sample refuses its whole request).",
                registry=registry,
            ),
            rejected_requests=Counter(
                "slorouter_training_sample_requests_rejected",
                "POST /v1/samples requests refused, by HTTP status.",
                ["status"],
                registry=registry,
            ),
            trainings=Counter(
                "slorouter_training_runs",
                "Trainings by model and outcome: accepted (published) or rejected (clearly worse; kept the "
                "current model).",
                ["model", "outcome"],
                registry=registry,
            ),
            training_duration=Histogram(
                "slorouter_training_duration_seconds",
                "Duration of one training.",
                ["model"],
                buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
                registry=registry,
            ),
            model_version=Gauge(
                "slorouter_training_model_version_info",
                "The published model version (value 1).",
                ["model", "version"],
                registry=registry,
            ),
            holdout_mape=Gauge(
                "slorouter_training_holdout_mape",
                "Hold-out MAPE of the published model (fraction).",
                ["model"],
                registry=registry,
            ),
            holdout_coverage=Gauge(
                "slorouter_training_holdout_coverage",
                "Hold-out coverage of the published model (share of latencies at or below the prediction).",
                ["model"],
                registry=registry,
            ),
            stored=Gauge(
                "slorouter_training_samples_stored",
                "Samples held in the store.",
                ["model"],
                registry=registry,
            ),
            model_requests=Counter(
                "slorouter_training_model_requests",
                "GET /v1/models/{model} by HTTP status (200 download, 304 not modified, 404 not trained).",
                ["model", "status"],
                registry=registry,
            ),
            refused=refusal_counter("slorouter_training_warm_start_refused", registry),
        )


class TrainingServer:
    """Sample store + trainer + model store behind an aiohttp application."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        state_dir: str | Path | None = None,
        save_interval_s: float = 60.0,
        store_config: StoreConfig | None = None,
        trainer_config: TrainerConfig | None = None,
        schema: FeatureSchema | None = None,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        max_samples_per_request: int = MAX_SAMPLES_PER_REQUEST,
        max_body_bytes: int = MAX_BODY_BYTES,
        train_poll_interval_s: float = 0.1,
        tokens: Sequence[str] = (),
        max_state_age_s: float | None = DEFAULT_MAX_AGE_S,
        wall_clock: Clock | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.tokens = BearerTokens(tokens)
        self.store = SampleStore(store_config or StoreConfig(), **({"schema": schema} if schema else {}))
        self.schema = self.store.schema
        self.model_store = ModelStore(self.model_dir)
        self.trainer_config = trainer_config or TrainerConfig()
        self.trainer = Trainer(self.store, self.model_store, self.trainer_config, clock or MonotonicClock())
        self.max_samples_per_request = max_samples_per_request
        self.max_body_bytes = max_body_bytes
        self.train_poll_interval_s = train_poll_interval_s
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = _Metrics.create(self.registry)
        self.training_errors = 0
        self.last_training_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: RunningServer | None = None
        self._published: dict[str, _PublishedModel] = {}
        self._model_versions: dict[str, str] = {}
        self.state_dir = None if state_dir is None else Path(state_dir)
        self.persistence: StatePersistence | None = None
        if self.state_dir is not None:
            self.persistence = StatePersistence(
                self.state_dir / SAMPLE_WINDOW,
                self.store,
                save_interval_s=save_interval_s,
                clock=self.trainer.clock,
                refused=self.metrics.refused,
                max_age_s=max_state_age_s,
                wall_clock=wall_clock,
            )
        self._lock: StateDirLock | None = None
        # The pool is known only once a router says (``pool_shape`` in its samples): the first one checks what
        # this server took over at start; models refused then are not served again.
        self._pool_check: asyncio.Future[None] | None = None
        self._withheld: dict[str, str] = {}  # kind -> refused version
        self._publish_current()

    def _publish_current(self) -> None:
        for kind in MODEL_KINDS:
            if self.trainer.current_version(kind) is not None:
                self._on_published(kind, self.model_store.load(kind))

    # -- lifecycle -------------------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        # With a token, everything but the probes needs it (the kubelet probes without one).
        middlewares = [aiohttp_auth_middleware(self.tokens, OPEN_PATHS)] if self.tokens else []
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=middlewares)
        app.router.add_post("/v1/samples", self._handle_samples)
        app.router.add_get("/v1/models/{kind}", self._handle_model)
        app.router.add_get("/v1/models/{kind}/metadata", self._handle_model_metadata)
        app.router.add_get("/v1/status", self._handle_status)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz_handler(self._usable))
        app.router.add_get("/metrics", metrics_handler(self.registry))
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
        check_bind(host, self.tokens, "the training server")
        if self.persistence is not None and self._lock is None:
            assert self.state_dir is not None
            self._lock = StateDirLock(self.state_dir)
            self.persistence.restore(self.trainer, None)
            self._withhold_refused()
            self._publish_current()
            for kind in MODEL_KINDS:
                self.metrics.stored.labels(kind).set(self.store.count(kind))
        self._server = await listen(self.build_app(), host, port)
        self._stop.clear()
        self._thread = threading.Thread(target=self._training_loop, name="slorouter-trainer", daemon=True)
        self._thread.start()
        return self._server

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # A training in progress finishes first (XGBoost cannot be interrupted); it is bounded.
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self._server is not None:
            await self._server.close()
            self._server = None
        if self._lock is not None:
            assert self.persistence is not None
            await asyncio.to_thread(self.persistence.save_pending)
            self._lock.release()
            self._lock = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the training server is not running")
        return self._server.url

    def _usable(self) -> bool:
        return self.model_dir.is_dir() and self._thread is not None and self._thread.is_alive()

    # -- training --------------------------------------------------------------------------------------------

    def _training_loop(self) -> None:
        while not self._stop.wait(self.train_poll_interval_s):
            self.train_due()
            if self.persistence is not None:
                self.persistence.maybe_save()

    def train_due(self) -> list[TrainingReport]:
        """Check what the warm start took over on the first live samples, then run the trainings that are
        due. Called by the training thread, the only one that trains."""
        try:
            if self.persistence is not None:
                for dropped in self.persistence.check_live(self.trainer):
                    self._withhold(dropped.kind, dropped.version)
                    self.metrics.stored.labels(dropped.kind).set(self.store.count(dropped.kind))
            reports = self.trainer.maybe_train()
        except Exception as exc:  # keep the loop alive; the next cadence tick retries
            self.training_errors += 1
            self.last_training_error = f"{type(exc).__name__}: {exc}"
            log.exception("training failed")
            return []
        for report in reports:
            self.metrics.trainings.labels(report.kind, "accepted" if report.accepted else "rejected").inc()
            self.metrics.training_duration.labels(report.kind).observe(report.duration_s)
            if report.accepted:
                self._on_published(report.kind, self.model_store.load(report.kind))
        return reports

    def _withhold(self, kind: ModelKind, version: str) -> None:
        """Serve ``version`` of ``kind`` no more (404) and take it out of the published-version series."""
        self._withheld[kind] = version
        if self._model_versions.get(kind) == version:
            del self._model_versions[kind]
            self.metrics.model_version.remove(kind, version)

    def _withhold_refused(self) -> None:
        """The stored models refused at start are neither baselines nor downloadable."""
        assert self.persistence is not None
        for refusal in self.persistence.report.refused:
            if refusal.item == "model" and refusal.kind != "all":
                version = self.model_store.latest_version(refusal.kind)
                if version is not None:
                    self._withhold(refusal.kind, version)

    def _on_published(self, kind: str, loaded: tuple[bytes, ModelMetadata] | None) -> None:
        if loaded is None:
            return
        metadata = loaded[1]
        previous = self._model_versions.get(kind)
        if previous is not None:
            self.metrics.model_version.remove(kind, previous)
        self.metrics.model_version.labels(kind, metadata.version).set(1)
        self._model_versions[kind] = metadata.version
        if "mape" in metadata.metrics:
            self.metrics.holdout_mape.labels(kind).set(metadata.metrics["mape"])
        if "coverage" in metadata.metrics:
            self.metrics.holdout_coverage.labels(kind).set(metadata.metrics["coverage"])

    # -- handlers --------------------------------------------------------------------------------------------

    async def _handle_samples(self, request: web.Request) -> web.Response:
        try:
            data = await read_json(request, self.max_body_bytes)
        except RequestError as exc:
            self.metrics.rejected_requests.labels(str(exc.status)).inc()
            return request_error_response(exc)
        try:
            batch = parse_samples(data, max_samples=self.max_samples_per_request, schema=self.schema)
            if batch.pool_shape is not None:
                await self._observe_pool_shape(batch.pool_shape)
            accepted = {
                kind: self.store.add(kind, matrix, latencies)
                for kind, (matrix, latencies) in batch.rows.items()
            }
            for kind in batch.retrain:
                self.trainer.expedite(kind)
        except (RequestError, FeatureError) as exc:
            self.metrics.rejected_requests.labels(str(getattr(exc, "status", 400))).inc()
            samples = data.get("samples") if isinstance(data, dict) else None
            if isinstance(samples, list):
                self.metrics.rejected.inc(len(samples))
            if isinstance(exc, RequestError):
                return request_error_response(exc)
            return error_response(400, str(exc))
        for kind, count in accepted.items():
            self.metrics.received.labels(kind).inc(count)
            self.metrics.stored.labels(kind).set(self.store.count(kind))
        # The published versions ride along, so a router can tell a prediction server serving an older one.
        answer = {"accepted": sum(accepted.values()), "model_versions": self._model_versions}
        return json_response(answer, status=202)

    async def _observe_pool_shape(self, shape: PoolShape) -> None:
        if self._pool_check is None:  # the first router to say checks the state taken over at start
            self._pool_check = asyncio.ensure_future(self._check_restored_state(shape))
        await self._pool_check  # later posts wait for that check, then find it done
        current = self.trainer.pool_shape
        merged = shape if current is None else current.union(shape)
        self.trainer.pool_shape = merged
        if self.persistence is not None:
            self.persistence.pool_shape = merged

    async def _check_restored_state(self, shape: PoolShape) -> None:
        """Refuse the models and samples taken over at start unless they were learnt on a pool ``shape``
        fits: the samples are dropped, and the models neither serve as baselines nor are downloadable."""
        refused = await asyncio.to_thread(self._drop_unfitting_state, shape)
        if refused is None:
            return
        versions, samples, exc = refused
        for kind, version in versions.items():
            self._withhold(kind, version)
            if self.persistence is not None:
                self.persistence.refuse_restored("model", kind, exc)
            else:
                self.metrics.refused.labels("model", "pool_shape").inc()
                log.warning("refused the stored %s model %s: %s", kind, version, exc)
        if samples:
            assert self.persistence is not None
            self.persistence.refuse_restored("samples", "all", exc)
            for kind in MODEL_KINDS:
                self.metrics.stored.labels(kind).set(self.store.count(kind))

    def _drop_unfitting_state(
        self, shape: PoolShape
    ) -> tuple[dict[ModelKind, str], bool, PoolShapeMismatchError] | None:
        """Between trainings: the restored models (by kind) and whether samples were dropped, and why; None
        when the state fits (or there is none)."""
        with self.trainer.paused():
            versions = {kind: v for kind in MODEL_KINDS if (v := self.trainer.current_version(kind))}
            samples = self.persistence is not None and bool(self.persistence.report.samples)
            if not (samples or versions):
                return None
            saved = self.trainer.pool_shape
            try:
                shape.check_saved(
                    None if saved is None else saved.to_dict(), what="the state taken over at start"
                )
                return None
            except PoolShapeMismatchError as exc:
                refusal = exc
            self.trainer.set_pool_shape(shape)  # refuses the stored models: they are no baselines any more
            if samples:
                self.store.clear()
            if self.persistence is not None:
                self.persistence.end_checks(self.trainer)
        return versions, samples, refusal

    async def _published_model(self, kind: ModelKind) -> _PublishedModel | None:
        version = self.model_store.latest_version(kind)
        if version is None or self._withheld.get(kind) == version:
            return None
        cached = self._published.get(kind)
        if cached is not None and cached.version == version:
            return cached
        found = await asyncio.to_thread(self.model_store.read_file, kind)
        if found is None:
            return None
        version, data = found
        # Decoding verifies the checksum: a damaged file fails here, not on every prediction server.
        _, metadata = decode_model_file(data)
        published = _PublishedModel(version, data, json.dumps(metadata.to_dict(), separators=(",", ":")))
        self._published[kind] = published
        return published

    async def _model_or_error(self, request: web.Request) -> _PublishedModel | web.Response:
        kind = request.match_info["kind"]
        if kind not in MODEL_KINDS:
            return error_response(404, f"unknown model {kind!r}; the models are {', '.join(MODEL_KINDS)}")
        model = await self._published_model(check_kind(kind))
        if model is None:
            return error_response(404, f"no {kind} model has been trained yet", code="not_trained")
        return model

    async def _handle_model(self, request: web.Request) -> web.Response:
        model = await self._model_or_error(request)
        kind = request.match_info["kind"]
        if isinstance(model, web.Response):
            if kind in MODEL_KINDS:
                self.metrics.model_requests.labels(kind, str(model.status)).inc()
            return model
        etag = f'"{model.version}"'
        if model.version in parse_etags(request.headers.get("If-None-Match")):
            self.metrics.model_requests.labels(kind, "304").inc()
            return web.Response(status=304, headers={"ETag": etag})
        self.metrics.model_requests.labels(kind, "200").inc()
        return web.Response(
            body=model.data,
            content_type=MODEL_CONTENT_TYPE,
            headers={"ETag": etag, MODEL_METADATA_HEADER: model.metadata_json},
        )

    async def _handle_model_metadata(self, request: web.Request) -> web.Response:
        model = await self._model_or_error(request)
        if isinstance(model, web.Response):
            return model
        return web.Response(
            body=model.metadata_json.encode(),
            content_type="application/json",
            headers={"ETag": f'"{model.version}"'},
        )

    async def _handle_status(self, _: web.Request) -> web.Response:
        return json_response(self.status())

    def status(self) -> dict[str, Any]:
        """The trainer's status (samples, buckets, versions, hold-out metrics, last trainings) and more."""
        return {
            **self.trainer.status(),
            "model_versions": {kind: self.trainer.current_version(kind) for kind in MODEL_KINDS},
            "training_errors": self.training_errors,
            "last_training_error": self.last_training_error,
            "pool_shape": None if self.trainer.pool_shape is None else self.trainer.pool_shape.to_dict(),
            "state": None
            if self.persistence is None
            else {
                "state_dir": str(self.state_dir),
                "save_interval_s": self.persistence.save_interval_s,
                "saves": self.persistence.saves,
                "save_errors": self.persistence.save_errors,
                "warm_start": self.persistence.report.to_dict(),
            },
            "store": {
                "queue_buckets": self.store.config.queue_buckets,
                "kv_buckets": self.store.config.kv_buckets,
                "prefix_buckets": self.store.config.prefix_buckets,
                "per_bucket": self.store.config.per_bucket,
                "memory_bytes": self.store.memory_bytes(),
            },
            "unix_time": time.time(),
        }
