"""The prediction server's bulk wire format (docs/predictor-api.md), defined once for both sides.

``POST /v1/predict/bulk`` takes either JSON rows ``{"rows": [{feature: value, ...}, ...]}`` or the binary
body: rows of little-endian float32 whose columns the ``X-Feature-Names`` header names in order. It answers
JSON ``{"predictions": [{"ttft_ms": x, "tpot_ms": y}, ...], "model_versions": {...}}`` (``tpot_ms`` null
before a TPOT model exists) or, to a binary request, n little-endian float64 TTFT values then n TPOT values
(NaN for none), with the model versions in the ``X-Model-Versions`` header.

``PredictionClient`` encodes rows and decodes predictions; the prediction server decodes rows
(``slorouter.predictor.bulk_rows``) and encodes predictions with ``encode_predictions`` /
``encode_binary_predictions``.
"""

from __future__ import annotations

import json

import numpy as np
import orjson

from slorouter.predictor.features import DEFAULT_SCHEMA, FeatureSchema

BULK_PATH = "/v1/predict/bulk"
MAX_ROWS = 10_000  # per bulk request
JSON_TYPE = "application/json"
BINARY_ROWS_TYPE = "application/vnd.slorouter.rows+f32"
BINARY_PREDICTIONS_TYPE = "application/vnd.slorouter.predictions+f64"
FEATURE_NAMES_HEADER = "X-Feature-Names"
MODEL_VERSIONS_HEADER = "X-Model-Versions"
ROW_DTYPE = np.dtype("<f4")
PREDICTION_DTYPE = np.dtype("<f8")


class RowEncoder:
    """Bulk request bodies of union matrices (``schema.all_features()`` columns) for a feature schema.

    The wire's columns are the TTFT model's features then the TPOT model's others (``names``), the same as
    ``all_features()`` except with ``pod_class``, whose columns are reordered. JSON numbers are written as
    short as exactness allows, because parsing them is most of the server's JSON cost: integral columns
    (token and request counts) as integers, the others with 9 significant digits, which round-trip every
    float32 value exactly.
    """

    def __init__(self, schema: FeatureSchema = DEFAULT_SCHEMA) -> None:
        ttft, tpot = schema.features("ttft"), schema.features("tpot")
        union = schema.all_features()
        self.schema = schema
        self.names: tuple[str, ...] = (*ttft, *(n for n in tpot if n not in ttft))
        self._columns = None if self.names == union else [union.index(n) for n in self.names]
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

    def _wire(self, x_all: np.ndarray) -> np.ndarray:
        return x_all if self._columns is None else x_all[:, self._columns]

    def encode(self, x_all: np.ndarray) -> bytes:
        """``{"rows": [...]}``: one JSON object per row keyed by feature name."""
        wire = self._wire(x_all)
        integral = ((wire == np.rint(wire)) & (np.abs(wire) < 2.0**53)).all(axis=0)
        template = self._template(integral)
        return ('{"rows":[' + ",".join([template % tuple(row) for row in wire.tolist()]) + "]}").encode()

    def encode_binary(self, x_all: np.ndarray) -> bytes:
        """The binary body: the rows as little-endian float32, columns in ``names`` order."""
        return np.ascontiguousarray(self._wire(x_all), dtype=ROW_DTYPE).tobytes()

    def headers(self, binary: bool) -> dict[str, str]:
        """The bulk request's headers for the JSON or the binary body."""
        if not binary:
            return {"Content-Type": JSON_TYPE}
        return {"Content-Type": BINARY_ROWS_TYPE, FEATURE_NAMES_HEADER: ",".join(self.names)}


def encode_predictions(ttft: np.ndarray, tpot: np.ndarray, versions: dict[str, str]) -> bytes:
    """The JSON bulk response, predictions rounded to 1 µs (orjson writes a NaN TPOT as null)."""
    rounded = zip(np.round(ttft, 3).tolist(), np.round(tpot, 3).tolist(), strict=True)
    predictions = [{"ttft_ms": a, "tpot_ms": b} for a, b in rounded]
    return orjson.dumps({"predictions": predictions, "model_versions": versions})


def encode_binary_predictions(ttft: np.ndarray, tpot: np.ndarray) -> bytes:
    """The binary bulk response body (the versions go in the ``X-Model-Versions`` header)."""
    return np.concatenate([ttft, tpot]).astype(PREDICTION_DTYPE, copy=False).tobytes()


def decode_predictions(body: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """TTFT and TPOT arrays of a JSON bulk response (a null TPOT is NaN)."""
    predictions = json.loads(body)["predictions"]
    if len(predictions) != n:
        raise ValueError(f"the server returned {len(predictions)} predictions for {n} rows")
    ttft = np.fromiter((p["ttft_ms"] for p in predictions), dtype=np.float64, count=n)
    tpot = np.array([p["tpot_ms"] for p in predictions], dtype=np.float64)  # None becomes NaN
    return ttft, tpot


def decode_binary_predictions(body: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """TTFT and TPOT arrays of a binary bulk response."""
    expected = 2 * PREDICTION_DTYPE.itemsize * n
    if len(body) != expected:
        raise ValueError(f"the server returned {len(body)} bytes for {n} rows; expected {expected}")
    values = np.frombuffer(body, dtype=PREDICTION_DTYPE).astype(np.float64)  # a writable copy, native order
    return values[:n], values[n:]


def check_predictions(ttft: np.ndarray, tpot: np.ndarray) -> None:
    """``ValueError`` unless every TTFT is a finite number >= 0 and every TPOT one too or NaN (no TPOT
    model yet): a NaN, infinite or negative latency is a malformed answer, never a routing input."""
    valid_ttft = np.isfinite(ttft) & (ttft >= 0)
    if not valid_ttft.all():
        bad = ttft[~valid_ttft][0]
        raise ValueError(f"a TTFT prediction is {float(bad)!r}: predictions must be finite and >= 0")
    valid_tpot = np.isnan(tpot) | (np.isfinite(tpot) & (tpot >= 0))
    if not valid_tpot.all():
        bad = tpot[~valid_tpot][0]
        raise ValueError(f"a TPOT prediction is {float(bad)!r}: predictions must be finite and >= 0 (or NaN)")


def error_message(payload: bytes) -> str:
    """The message of the servers' JSON error body ``{"error": {"message": ...}}`` (else the body's start)."""
    try:
        return str(json.loads(payload)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return payload[:200].decode(errors="replace")


def model_versions_in(payload: bytes) -> dict[str, str] | None:
    """The ``model_versions`` a predictor server's JSON answer names (a prediction server's ``/readyz``, the
    training server's answer to samples), kinds to version strings; None when it names none."""
    try:
        versions = json.loads(payload).get("model_versions")
    except (ValueError, AttributeError):
        return None
    if not isinstance(versions, dict):
        return None
    return {str(kind): version for kind, version in versions.items() if isinstance(version, str)}
