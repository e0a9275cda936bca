"""The prediction server: TTFT/TPOT predictions over HTTP from the newest trained models.

Its ``ModelSource`` (``slorouter.predictor.model_sources``) is polled on an interval and loads a model only
when its version changes. Until a first real training's models are loaded, prediction endpoints answer 503
and ``/readyz`` fails. Bulk rows are decoded by ``slorouter.predictor.bulk_rows``; the bulk wire format is
``slorouter.predictor.wire``'s. With ``enable_fault_injection`` it also serves ``/admin/faults``
(``slorouter.predictor.faults``) and plays the faults it is given on its prediction endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from slorouter.faults.admin import FaultAdmin
from slorouter.faults.kinds import Fault
from slorouter.faults.plan import FaultPlan
from slorouter.http.auth import BearerTokens, check_bind, lean_auth
from slorouter.http.errors import RequestError
from slorouter.http.json_bodies import lean_body, lean_error, lean_json, parse_json
from slorouter.http.running import RunningServer, listen_lean
from slorouter.http.server import HttpRequest, HttpServer, Response, json_error
from slorouter.predictor.bulk_rows import BinaryRows, JsonRows
from slorouter.predictor.faults import BAD_VALUES, NOT_PREDICTIONS, PREDICT, PREDICTION_FAULTS
from slorouter.predictor.features import FeatureError
from slorouter.predictor.model_sources import ModelSource
from slorouter.predictor.predictor import PredictorNotReady
from slorouter.predictor.wire import (
    BINARY_PREDICTIONS_TYPE,
    BINARY_ROWS_TYPE,
    BULK_PATH,
    FEATURE_NAMES_HEADER,
    JSON_TYPE,
    MAX_ROWS,
    MODEL_VERSIONS_HEADER,
    encode_binary_predictions,
    encode_predictions,
)

log = logging.getLogger("slorouter.predictor.prediction_server")

# 10,000 rows of every feature with long decimals stay well under this.
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass
class _Metrics:
    requests: Counter
    rows: Counter
    reloads: Counter
    sync_errors: Counter
    ready: Gauge
    model_version: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> _Metrics:
        return cls(
            requests=Counter(
                "slorouter_prediction_requests",
                "Prediction requests by endpoint and HTTP status.",
                ["endpoint", "status"],
                registry=registry,
            ),
            rows=Counter("slorouter_prediction_rows", "Rows predicted.", registry=registry),
            reloads=Counter(
                "slorouter_prediction_model_reloads", "Model loads after a version change.", registry=registry
            ),
            sync_errors=Counter(
                "slorouter_prediction_model_sync_errors", "Failed model synchronisations.", registry=registry
            ),
            ready=Gauge("slorouter_prediction_ready", "1 once trained models are loaded.", registry=registry),
            model_version=Gauge(
                "slorouter_prediction_model_version_info",
                "The loaded model version (value 1).",
                ["model", "version"],
                registry=registry,
            ),
        )


class PredictionServer:
    """Predictions over the gateway's lean HTTP server, from a ``Predictor`` kept fresh by its
    ``ModelSource``."""

    def __init__(
        self,
        source: ModelSource,
        *,
        poll_interval_s: float = 1.0,
        max_rows: int = MAX_ROWS,
        max_body_bytes: int = MAX_BODY_BYTES,
        registry: CollectorRegistry | None = None,
        tokens: Sequence[str] = (),
        enable_fault_injection: bool = False,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        self.source = source
        self.poll_interval_s = poll_interval_s
        self.max_rows = max_rows
        self.max_body_bytes = max_body_bytes
        self.tokens = BearerTokens(tokens)
        self.predictor = source.make_predictor()
        self._json_rows = JsonRows(self.predictor.schema)
        self._binary_rows = BinaryRows(self.predictor.schema)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = _Metrics.create(self.registry)
        self._bulk_ok = self.metrics.requests.labels("bulk", "200")
        self._versions_seen: dict[str, str | None] = {}
        self._versions: dict[str, str] = {}
        self._versions_json = "{}"
        self.last_reload_unix: float | None = None
        self.last_sync_error: str | None = None
        self._poller: asyncio.Task[None] | None = None
        self._server: RunningServer | None = None
        self._synced = asyncio.Event()
        self._sync_lock = asyncio.Lock()
        # None unless enabled: then /admin/faults exists and the prediction endpoints draw from it.
        self.faults: FaultPlan | None = FaultPlan() if enable_fault_injection else None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def build_http(self) -> HttpServer:
        http = HttpServer(max_body_bytes=self.max_body_bytes)
        # With a token, everything but the probes needs it (the kubelet probes without one).
        http.add_route("POST", BULK_PATH, lean_auth(self.tokens, self._handle_bulk))
        http.add_route("POST", "/v1/predict", lean_auth(self.tokens, self._handle_single))
        http.add_route("GET", "/v1/status", lean_auth(self.tokens, self._handle_status))
        http.add_route("GET", "/healthz", self._handle_healthz)
        http.add_route("GET", "/readyz", self._handle_readyz)
        http.add_route("GET", "/metrics", lean_auth(self.tokens, self._handle_metrics))
        if self.faults is not None:
            FaultAdmin(self.faults, PREDICTION_FAULTS).add_routes(http)
        return http

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
        check_bind(host, self.tokens, "the prediction server")
        # The gateway's lean HTTP/1.1 server: about a third of aiohttp's CPU per request.
        self._server = await listen_lean(self.build_http(), host, port)
        self._poller = asyncio.create_task(self._poll_loop(), name="prediction-server-model-poll")
        return self._server

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self._server is not None:
            await self._server.close()
            self._server = None
        await self.source.close()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the prediction server is not running")
        return self._server.url

    @property
    def ready(self) -> bool:
        return self.predictor.ready

    async def wait_synced(self) -> None:
        """Wait for the first synchronisation attempt (successful or not)."""
        await self._synced.wait()

    async def sync_now(self) -> bool:
        """One synchronisation with the model source; True if a new model version was loaded."""
        try:
            async with self._sync_lock:  # the poller and a direct call must not load the same version twice
                changed = await self.source.sync(self.predictor)
        except Exception as exc:  # a dead training server or a bad file must not kill the poller
            self.metrics.sync_errors.inc()
            self.last_sync_error = f"{type(exc).__name__}: {exc}"
            log.warning("model synchronisation failed: %s", self.last_sync_error)
            return False
        finally:
            self._synced.set()
        self.last_sync_error = None
        if changed:
            self._on_reload()
        return changed

    def _on_reload(self) -> None:
        versions = {kind: version for kind, version in self.predictor.versions.items() if version}
        self.metrics.reloads.inc()
        self.metrics.model_version.clear()
        for kind, version in versions.items():
            self.metrics.model_version.labels(kind, version).set(1)
        self.metrics.ready.set(1 if self.predictor.ready else 0)
        self._current_versions_json()
        self.last_reload_unix = time.time()
        log.info("loaded models %s", versions)

    async def _poll_loop(self) -> None:
        while True:
            await self.sync_now()
            await asyncio.sleep(self.poll_interval_s)

    # -- handlers --------------------------------------------------------------------------------------------

    def _not_ready(self) -> Response:
        return json_error(
            503,
            "no trained model is loaded yet; predictions start after the first training",
            code="not_ready",
        )

    def _failure(self, route: str, exc: Exception) -> Response:
        """The answer (and the counted status) for a request that is invalid or finds no model loaded."""
        if isinstance(exc, RequestError):
            status, response = exc.status, lean_error(exc)
        elif isinstance(exc, FeatureError):
            status, response = 400, json_error(400, str(exc))
        else:
            status, response = 503, self._not_ready()
        self.metrics.requests.labels(route, str(status)).inc()
        return response

    async def _fault(self, request: HttpRequest) -> tuple[Fault | None, Response | None]:
        """The injected fault this request gets, and the answer that replaces the real one, if any."""
        fault = self.faults.draw(PREDICT) if self.faults else None
        if fault is None:
            return None, None
        if fault.name == "hang":
            await asyncio.get_running_loop().create_future()  # until the client goes away (cancelled)
        if fault.name == "delay":
            await asyncio.sleep(fault.param("delay_ms") / 1000)
        elif fault.name == "status":
            status = int(fault.param("status"))
            return fault, json_error(status, f"injected fault: status {status}", code="injected_fault")
        elif fault.name == "malformed":
            binary = (request.header(b"content-type") or b"").startswith(BINARY_ROWS_TYPE.encode())
            content_type = BINARY_PREDICTIONS_TYPE if binary else JSON_TYPE
            return fault, Response(200, NOT_PREDICTIONS, content_type=content_type.encode())
        return fault, None

    async def _handle_bulk(self, request: HttpRequest) -> Response:
        fault, replaced = await self._fault(request) if self.faults else (None, None)
        if replaced is not None:
            return replaced
        if not self.predictor.ready:
            self.metrics.requests.labels("bulk", "503").inc()
            return self._not_ready()
        binary = False
        try:
            body = lean_body(request)
            content_type = request.header(b"content-type")
            if content_type is not None and content_type.startswith(BINARY_ROWS_TYPE.encode()):
                binary = True
                x_all = self._binary_rows(
                    body, request.header(FEATURE_NAMES_HEADER.lower().encode()), self.max_rows
                )
                n = len(x_all)
                ttft, tpot = self.predictor.predict_all(x_all)
            else:
                rows = self._rows(parse_json(body))
                n = len(rows)
                matrix = self._json_rows(rows)
                if matrix is None:
                    ttft, tpot = self.predictor.predict_rows(rows)
                else:
                    ttft, tpot = self.predictor.predict_all(matrix)
        except (RequestError, FeatureError, PredictorNotReady) as exc:
            return self._failure("bulk", exc)
        if fault is not None and fault.name in BAD_VALUES:
            ttft = np.full(len(ttft), BAD_VALUES[fault.name])
        self._bulk_ok.inc()
        self.metrics.rows.inc(n)
        if binary:
            return self._encode_binary(ttft, tpot)
        body = encode_predictions(ttft, tpot, self.model_versions)
        return Response(200, body, content_type=JSON_TYPE.encode())

    def _rows(self, data: Any) -> list[Any]:
        if not isinstance(data, dict):
            raise RequestError('body must be a JSON object {"rows": [...]}')
        rows = data.get("rows")
        if not isinstance(rows, list):
            raise RequestError('"rows" must be a list of feature objects', param="rows")
        if not rows:
            raise RequestError('"rows" must not be empty', param="rows")
        if len(rows) > self.max_rows:
            raise RequestError(
                f'"rows" holds {len(rows)} rows; at most {self.max_rows} are allowed per request',
                param="rows",
                status=413,
            )
        return rows

    def _encode_binary(self, ttft: np.ndarray, tpot: np.ndarray) -> Response:
        versions = self._current_versions_json().encode()
        return Response(
            200,
            encode_binary_predictions(ttft, tpot),
            content_type=BINARY_PREDICTIONS_TYPE.encode(),
            raw_headers=b"%s: %s\r\n" % (MODEL_VERSIONS_HEADER.encode(), versions),
        )

    def _current_versions_json(self) -> str:
        # Models load one kind at a time, so the versions can move between two reloads of the whole set.
        versions = self.predictor.versions
        if versions != self._versions_seen:
            self._versions_seen = versions
            self._versions = {kind: version for kind, version in versions.items() if version}
            self._versions_json = json.dumps(self._versions, separators=(",", ":"))
        return self._versions_json

    @property
    def model_versions(self) -> dict[str, str]:
        self._current_versions_json()
        return self._versions

    async def _handle_single(self, request: HttpRequest) -> Response:
        fault, replaced = await self._fault(request) if self.faults else (None, None)
        if replaced is not None:
            return replaced
        if not self.predictor.ready:
            self.metrics.requests.labels("single", "503").inc()
            return self._not_ready()
        try:
            row = parse_json(lean_body(request))
            if not isinstance(row, dict):
                raise RequestError("body must be one JSON object of feature values {NAME: number, ...}")
            ttft, tpot = self.predictor.predict_rows([row])
        except (RequestError, FeatureError, PredictorNotReady) as exc:
            return self._failure("single", exc)
        if fault is not None and fault.name in BAD_VALUES:
            ttft = np.full(1, BAD_VALUES[fault.name])
        self.metrics.requests.labels("single", "200").inc()
        self.metrics.rows.inc()
        tpot_ms = float(tpot[0])
        return lean_json(
            {
                "ttft_ms": round(float(ttft[0]), 3),
                "tpot_ms": None if tpot_ms != tpot_ms else round(tpot_ms, 3),
                "model_versions": self.model_versions,
            }
        )

    async def _handle_status(self, _: HttpRequest) -> Response:
        return lean_json(self.status())

    async def _handle_healthz(self, _: HttpRequest) -> Response:
        return lean_json({"status": "ok"})

    async def _handle_readyz(self, _: HttpRequest) -> Response:
        if self.ready:
            return lean_json({"status": "ready", "model_versions": self.model_versions})
        return lean_json({"status": "not ready", "model_versions": self.model_versions}, status=503)

    async def _handle_metrics(self, _: HttpRequest) -> Response:
        return Response(200, generate_latest(self.registry), content_type=CONTENT_TYPE_LATEST.encode())

    def status(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "model_versions": self.model_versions,
            "predictor": self.predictor.status(),
            "source": self.source.describe(),
            "poll_interval_s": self.poll_interval_s,
            "last_reload_unix": self.last_reload_unix,
            "last_sync_error": self.last_sync_error,
            "max_rows": self.max_rows,
            "faults": None if self.faults is None else self.faults.describe(),
        }
