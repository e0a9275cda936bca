"""The prediction server: TTFT/TPOT predictions over HTTP from the newest trained models.

Models come from a shared model directory or from the training server (``GET /v1/models/{kind}`` with
``If-None-Match``), polled on an interval; a model is loaded only when its version changes. Until both models
of a first real training are loaded, prediction endpoints answer 503 and ``/readyz`` fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import numpy as np
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from slorouter.http.errors import RequestError
from slorouter.http.json_bodies import lean_body, lean_error, lean_json, parse_json
from slorouter.http.running import RunningServer, listen_lean
from slorouter.http.server import HttpRequest, HttpServer, Response, json_error
from slorouter.predictor.features import (
    DERIVED_FEATURES,
    EFFECTIVE_INPUT_TOKENS,
    FRACTION_FEATURES,
    INPUT_TOKEN_LENGTH,
    MAX_COUNT,
    MODEL_KINDS,
    POD_CLASS,
    POD_CLASS_CODES,
    PREFIX_CACHE_SCORE,
    FeatureError,
    FeatureSchema,
    ModelKind,
    SchemaMismatchError,
    rows_to_matrices,
)
from slorouter.predictor.model_store import ModelFileError, ModelStore, decode_model_file
from slorouter.predictor.predictor import Predictor, PredictorNotReady

log = logging.getLogger("slorouter.predictor.prediction_server")

MAX_ROWS = 10_000
# 10,000 rows of every feature with long decimals stay well under this.
MAX_BODY_BYTES = 16 * 1024 * 1024
# The optional binary bulk format (see docs/predictor-api.md): float32 rows in, float64 predictions out.
BINARY_ROWS_TYPE = "application/vnd.slorouter.rows+f32"
BINARY_PREDICTIONS_TYPE = "application/vnd.slorouter.predictions+f64"
FEATURE_NAMES_HEADER = "X-Feature-Names"
MODEL_VERSIONS_HEADER = "X-Model-Versions"


class ModelSource(Protocol):
    """Where the prediction server gets its models from."""

    def describe(self) -> dict[str, Any]: ...

    def make_predictor(self) -> Predictor: ...

    async def sync(self, predictor: Predictor) -> bool:
        """Load any model whose version changed; True if something new was loaded."""
        ...

    async def close(self) -> None: ...


class DirectorySource:
    """Models from a shared model directory (written atomically by a trainer)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def describe(self) -> dict[str, Any]:
        return {"type": "directory", "path": str(self.directory)}

    def make_predictor(self) -> Predictor:
        return Predictor(ModelStore(self.directory))

    async def sync(self, predictor: Predictor) -> bool:
        # Reading and parsing a model file is blocking work: keep it off the event loop.
        return await asyncio.to_thread(predictor.refresh)

    async def close(self) -> None:
        return None


class TrainingServerSource:
    """Models downloaded from the training server, each only when its ETag (the version) changes."""

    def __init__(
        self, url: str, *, timeout_s: float = 10.0, session: aiohttp.ClientSession | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = session
        self._own_session = session is None
        self._refused: dict[str, str] = {}

    def describe(self) -> dict[str, Any]:
        return {"type": "training-server", "url": self.url}

    def make_predictor(self) -> Predictor:
        return Predictor()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # The model metadata header can outgrow aiohttp's 8 KiB default.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s), max_field_size=1024 * 1024
            )
        return self._session

    async def sync(self, predictor: Predictor) -> bool:
        session = self._get_session()
        changed = False
        for kind in MODEL_KINDS:
            current = predictor.versions.get(kind)
            # Versions this server refused (another schema, say) are not downloaded again either.
            known = [v for v in (current, self._refused.get(kind)) if v]
            headers = {"If-None-Match": ", ".join(f'"{v}"' for v in known)} if known else {}
            async with session.get(f"{self.url}/v1/models/{kind}", headers=headers) as response:
                if response.status in (304, 404):
                    continue
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise RuntimeError(f"GET /v1/models/{kind}: HTTP {response.status}: {text}")
                data = await response.read()
            try:
                await asyncio.to_thread(self._load, predictor, kind, data)
            except (ModelFileError, SchemaMismatchError, ValueError) as exc:
                version = response.headers.get("ETag", "").strip('"')
                self._refused[kind] = version
                predictor.errors[kind] = str(exc)
                log.error("refused %s model %s from %s: %s", kind, version, self.url, exc)
                continue
            changed = True
        return changed

    @staticmethod
    def _load(predictor: Predictor, kind: ModelKind, data: bytes) -> None:
        raw, metadata = decode_model_file(data)
        predictor.load_raw(kind, raw, metadata)

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None


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


class RowMatrices:
    """The float32 matrix of the union of both models' features (``schema.all_features()`` order, which
    ``Predictor.predict_all`` takes) straight from bulk rows, for rows that are plainly valid.

    One ``itemgetter`` per row into one flat list, one type check over it, one ``np.array`` and vectorised
    range checks: about half the cost of the library's column-by-column validation. Anything not plainly
    valid (a missing or derived-only field, a non-number, a value out of range) returns None, and the caller
    runs the library's ``rows_to_matrices``, which names the bad row and field or derives what may be
    derived; so this path can only accept what the library accepts.
    """

    def __init__(self, schema: FeatureSchema) -> None:
        names = schema.all_features()
        self._width = len(names)
        self._getter = itemgetter(*names)
        self._low = np.zeros(len(names))
        self._high = np.array([1.0 if n in FRACTION_FEATURES else MAX_COUNT for n in names])
        self._pod_class = names.index(POD_CLASS) if POD_CLASS in names else None
        if self._pod_class is not None:
            self._high[self._pod_class] = POD_CLASS_CODES - 1

    def __call__(self, rows: list[Any]) -> np.ndarray | None:
        try:
            values = list(chain.from_iterable(map(self._getter, rows)))
        except (KeyError, TypeError):
            return None
        if not set(map(type, values)) <= _NUMBER_TYPES:  # bools and numeric strings would pass np.array
            return None
        try:
            matrix = np.array(values, dtype=np.float64).reshape(len(rows), self._width)
        except OverflowError:
            return None
        if not ((matrix >= self._low) & (matrix <= self._high)).all():
            return None
        if self._pod_class is not None and not np.array_equal(
            matrix[:, self._pod_class], np.floor(matrix[:, self._pod_class])
        ):
            return None
        return matrix.astype(np.float32)


_NUMBER_TYPES = frozenset({int, float})


class _Layout:
    """Where a binary body's columns go: the body column of each feature of the union."""

    __slots__ = ("columns", "derive", "union")

    def __init__(self, columns: list[str], union: np.ndarray, derive: int | None) -> None:
        self.columns = columns
        self.union = union
        self.derive = derive  # the union column of effective_input_tokens when it must be derived


class BinaryRows:
    """The union matrix (``schema.all_features()`` order) from a binary bulk body: little-endian float32
    rows whose columns are named by the ``X-Feature-Names`` header (any order; every feature of the schema,
    ``effective_input_tokens`` may be left out and is then derived; other columns are ignored). Validation
    is the library's: a bad value raises the same ``FeatureError`` naming its row and field as the JSON rows
    would."""

    def __init__(self, schema: FeatureSchema) -> None:
        self.schema = schema
        self._names = schema.all_features()
        self._bounds = self._bounds_of(self._names)
        self._layouts: dict[bytes, _Layout] = {}

    @staticmethod
    def _bounds_of(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, int | None]:
        high = np.array([1.0 if n in FRACTION_FEATURES else MAX_COUNT for n in names])
        pod_class = names.index(POD_CLASS) if POD_CLASS in names else None
        if pod_class is not None:
            high[pod_class] = POD_CLASS_CODES - 1
        return np.zeros(len(names)), high, pod_class

    def _layout(self, header: bytes | None) -> _Layout:
        if header is None:
            raise RequestError(f"a {BINARY_ROWS_TYPE} body needs the {FEATURE_NAMES_HEADER} header")
        layout = self._layouts.get(header)
        if layout is not None:
            return layout
        columns = [name.strip() for name in header.decode("latin-1").split(",")]
        if len(set(columns)) != len(columns):
            raise RequestError(f"{FEATURE_NAMES_HEADER} names a column twice: {', '.join(columns)}")
        missing = [n for n in self._names if n not in columns and n not in DERIVED_FEATURES]
        if missing:
            raise RequestError(f"{FEATURE_NAMES_HEADER} lacks required feature(s): {', '.join(missing)}")
        derive = None if EFFECTIVE_INPUT_TOKENS in columns else self._names.index(EFFECTIVE_INPUT_TOKENS)
        layout = _Layout(
            columns,
            np.array([columns.index(n) if n in columns else 0 for n in self._names], dtype=np.intp),
            derive,
        )
        if len(self._layouts) < 16:
            self._layouts[header] = layout
        return layout

    def __call__(self, body: bytes, header: bytes | None, max_rows: int) -> np.ndarray:
        layout = self._layout(header)
        width = len(layout.columns)
        if len(body) % (4 * width):
            raise RequestError(
                f"a {BINARY_ROWS_TYPE} body must hold whole rows of {width} float32 values "
                f"({4 * width} bytes); got {len(body)} bytes"
            )
        n = len(body) // (4 * width)
        if n > max_rows:
            raise RequestError(
                f"the body holds {n} rows; at most {max_rows} are allowed per request",
                param="rows",
                status=413,
            )
        raw = np.frombuffer(body, dtype="<f4").reshape(n, width)
        matrix = raw.take(layout.union, axis=1).astype(np.float32, copy=False)  # native order, C-contiguous
        if layout.derive is not None:  # as the library derives it: in float64, then float32
            names = self._names
            prefix = matrix[:, names.index(PREFIX_CACHE_SCORE)].astype(np.float64)
            length = matrix[:, names.index(INPUT_TOKEN_LENGTH)].astype(np.float64)
            matrix[:, layout.derive] = (1.0 - prefix) * length
        low, high, pod_class = self._bounds
        ok = (matrix >= low) & (matrix <= high)  # NaN fails both
        if pod_class is not None:
            ok[:, pod_class] &= np.floor(matrix[:, pod_class]) == matrix[:, pod_class]
        if not ok.all():
            self._raise_first_error(raw, layout.columns, int(np.flatnonzero(~ok.all(axis=1))[0]))
        return matrix

    def _raise_first_error(self, raw: np.ndarray, columns: list[str], index: int) -> None:
        row = dict(zip(columns, raw[index].astype(np.float64).tolist(), strict=True))
        rows_to_matrices([row], schema=self.schema, indices=[index])  # raises the library's FeatureError
        raise FeatureError(f"rows[{index}]: invalid feature values", index=index)  # not reached


class PredictionServer:
    """An aiohttp application serving predictions from a ``Predictor`` kept fresh by a ``ModelSource``."""

    def __init__(
        self,
        source: ModelSource,
        *,
        poll_interval_s: float = 1.0,
        max_rows: int = MAX_ROWS,
        max_body_bytes: int = MAX_BODY_BYTES,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        self.source = source
        self.poll_interval_s = poll_interval_s
        self.max_rows = max_rows
        self.max_body_bytes = max_body_bytes
        self.predictor = source.make_predictor()
        self._row_matrices = RowMatrices(self.predictor.schema)
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

    # -- lifecycle -------------------------------------------------------------------------------------------

    def build_http(self) -> HttpServer:
        http = HttpServer(max_body_bytes=self.max_body_bytes)
        http.add_route("POST", "/v1/predict/bulk", self._handle_bulk)
        http.add_route("POST", "/v1/predict", self._handle_single)
        http.add_route("GET", "/v1/status", self._handle_status)
        http.add_route("GET", "/healthz", self._handle_healthz)
        http.add_route("GET", "/readyz", self._handle_readyz)
        http.add_route("GET", "/metrics", self._handle_metrics)
        return http

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
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

    async def _handle_bulk(self, request: HttpRequest) -> Response:
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
                x_all = self._row_matrices(rows)
                if x_all is None:
                    ttft, tpot = self.predictor.predict_rows(rows)
                else:
                    ttft, tpot = self.predictor.predict_all(x_all)
        except (RequestError, FeatureError, PredictorNotReady) as exc:
            return self._failure("bulk", exc)
        self._bulk_ok.inc()
        self.metrics.rows.inc(n)
        if binary:
            return self._encode_binary(ttft, tpot)
        return Response(200, self._encode_bulk(ttft, tpot), content_type=b"application/json")

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

    def _encode_bulk(self, ttft: np.ndarray, tpot: np.ndarray) -> bytes:
        """``{"predictions": [{"ttft_ms": x, "tpot_ms": y}, ...], "model_versions": {...}}``, written as one
        orjson array of [ttft, tpot] pairs turned into the objects by byte replacements (numbers hold no
        ``,``, ``[`` or ``]``): no Python object per row."""
        n = len(ttft)
        if n == 0:
            predictions = b""
        else:
            # Rounded to 1 µs; orjson writes the shortest repr, and a NaN TPOT (no TPOT model yet) as null.
            pairs = np.empty((n, 2), dtype=np.float64)
            np.round(ttft, 3, out=pairs[:, 0])
            np.round(tpot, 3, out=pairs[:, 1])
            numbers = orjson.dumps(pairs, option=orjson.OPT_SERIALIZE_NUMPY)[2:-2]  # a,b],[c,d
            predictions = b'{"ttft_ms":%s}' % (
                numbers.replace(b"],[", b"}{").replace(b",", b',"tpot_ms":').replace(b"}{", b'},{"ttft_ms":')
            )
        return b'{"predictions":[%s],"model_versions":%s}' % (
            predictions,
            self._current_versions_json().encode(),
        )

    def _encode_binary(self, ttft: np.ndarray, tpot: np.ndarray) -> Response:
        body = np.concatenate([ttft, tpot]).astype("<f8", copy=False).tobytes()
        versions = self._current_versions_json().encode()
        return Response(
            200,
            body,
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
        }


def make_source(
    *, model_dir: str | None = None, training_server: str | None = None
) -> DirectorySource | TrainingServerSource:
    if (model_dir is None) == (training_server is None):
        raise ValueError("give exactly one of model_dir and training_server")
    if model_dir is not None:
        return DirectorySource(model_dir)
    assert training_server is not None
    return TrainingServerSource(training_server)
