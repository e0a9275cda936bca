"""The prediction server on 127.0.0.1: readiness, both model sources, reloads, bulk contract and limits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from slorouter.predictor.bulk_rows import BinaryRows, JsonRows
from slorouter.predictor.features import FeatureError, FeatureSchema, rows_to_matrices
from slorouter.predictor.model_sources import make_source
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.prediction_server import PredictionServer
from slorouter.predictor.predictor import Predictor
from slorouter.predictor.training_server import TrainingServer
from slorouter.predictor.wire import (
    BINARY_PREDICTIONS_TYPE,
    BINARY_ROWS_TYPE,
    FEATURE_NAMES_HEADER,
    MODEL_VERSIONS_HEADER,
    RowEncoder,
    decode_binary_predictions,
    encode_predictions,
)
from tests.helpers import predictor_models as common
from tests.helpers.predictor_models import (
    FAST_TRAINING,
    copy_models,
    eventually,
    feature_rows,
    republish,
    samples_body,
    samples_request,
    synthetic,
)

http = common.http
trained_dir = common.trained_dir
model_dir = common.model_dir


@pytest.fixture
async def empty_server(tmp_path: Path) -> AsyncIterator[PredictionServer]:
    server = PredictionServer(make_source(model_dir=str(tmp_path / "models")), poll_interval_s=0.02)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def server(model_dir: Path) -> AsyncIterator[PredictionServer]:
    prediction = PredictionServer(
        make_source(model_dir=str(model_dir)), poll_interval_s=0.02, max_rows=10_000
    )
    await prediction.start()
    await eventually(lambda: all(prediction.predictor.versions.values()))
    try:
        yield prediction
    finally:
        await prediction.stop()


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.json()


def expected(directory: Path, rows: list[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    predictor = Predictor(ModelStore(directory))
    predictor.refresh()
    return predictor.predict_rows(rows)


async def test_not_ready_until_a_trained_model_appears(
    empty_server: PredictionServer, trained_dir: Path, http: aiohttp.ClientSession
) -> None:
    url = empty_server.url
    rows = feature_rows(*synthetic(3)[::2])
    async with http.get(url + "/readyz") as r:
        assert r.status == 503
    async with http.get(url + "/healthz") as r:
        assert r.status == 200
    status, body = await post(http, url + "/v1/predict/bulk", {"rows": rows})
    assert status == 503 and body["error"]["type"] == "ServiceUnavailableError"
    status, _ = await post(http, url + "/v1/predict", rows[0])
    assert status == 503
    async with http.get(url + "/v1/status") as r:
        assert (await r.json())["ready"] is False

    copy_models(trained_dir, Path(empty_server.source.describe()["path"]))
    await eventually(lambda: all(empty_server.predictor.versions.values()))
    async with http.get(url + "/readyz") as r:
        assert r.status == 200
        assert set((await r.json())["model_versions"]) == {"ttft", "tpot"}
    status, body = await post(http, url + "/v1/predict/bulk", {"rows": rows})
    assert status == 200 and len(body["predictions"]) == 3


async def test_bulk_predictions_in_row_order(
    server: PredictionServer, model_dir: Path, http: aiohttp.ClientSession
) -> None:
    x_ttft, _, x_tpot, _ = synthetic(500, seed=5)
    rows = feature_rows(x_ttft, x_tpot)
    status, body = await post(http, server.url + "/v1/predict/bulk", {"rows": rows})
    assert status == 200
    ttft, tpot = expected(model_dir, rows)
    assert len(body["predictions"]) == 500
    np.testing.assert_allclose([p["ttft_ms"] for p in body["predictions"]], ttft, rtol=1e-6, atol=1e-3)
    np.testing.assert_allclose([p["tpot_ms"] for p in body["predictions"]], tpot, rtol=1e-6, atol=1e-3)
    store = ModelStore(model_dir)
    assert body["model_versions"] == {k: store.latest_version(k) for k in ("ttft", "tpot")}

    # Reversed rows, reversed answers.
    status, reversed_body = await post(http, server.url + "/v1/predict/bulk", {"rows": rows[::-1]})
    assert reversed_body["predictions"] == body["predictions"][::-1]

    # The derived effective_input_tokens may be left out.
    slim = [{k: v for k, v in row.items() if k != "effective_input_tokens"} for row in rows[:5]]
    status, slim_body = await post(http, server.url + "/v1/predict/bulk", {"rows": slim})
    assert status == 200
    np.testing.assert_allclose(
        [p["ttft_ms"] for p in slim_body["predictions"]],
        [p["ttft_ms"] for p in body["predictions"][:5]],
        rtol=1e-4,
    )


async def test_single_prediction(
    server: PredictionServer, model_dir: Path, http: aiohttp.ClientSession
) -> None:
    rows = feature_rows(*synthetic(2, seed=3)[::2])
    status, body = await post(http, server.url + "/v1/predict", rows[1])
    assert status == 200
    ttft, tpot = expected(model_dir, rows)
    assert body["ttft_ms"] == pytest.approx(ttft[1], abs=1e-3)
    assert body["tpot_ms"] == pytest.approx(tpot[1], abs=1e-3)
    assert set(body["model_versions"]) == {"ttft", "tpot"}
    status, error = await post(http, server.url + "/v1/predict", {"row": rows[1]})
    assert (
        status == 400
        and "rows[0].kv_cache_percentage: required field is missing" in error["error"]["message"]
    )
    status, error = await post(http, server.url + "/v1/predict", [rows[1]])
    assert status == 400


BAD_BULK = [
    pytest.param(b"[", "not valid JSON", id="not-json"),
    pytest.param([], "must be a JSON object", id="list-body"),
    pytest.param({"requests": []}, '"rows" must be a list', id="no-rows"),
    pytest.param({"rows": []}, "must not be empty", id="empty"),
    pytest.param({"rows": [1]}, "rows[0]: must be an object", id="row-not-object"),
]


@pytest.mark.parametrize(("body", "message"), BAD_BULK)
async def test_bulk_rejects_bad_bodies(
    server: PredictionServer, http: aiohttp.ClientSession, body: Any, message: str
) -> None:
    status, error = await post(http, server.url + "/v1/predict/bulk", body)
    assert status == 400
    assert message in error["error"]["message"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kv_cache_percentage", 1.5, "rows[3].kv_cache_percentage: must be between 0 and 1, got 1.5"),
        ("num_request_waiting", -1, "rows[3].num_request_waiting: must be >= 0"),
        ("input_token_length", "12", "rows[3].input_token_length: must be a number"),
        ("num_tokens_generated", None, "rows[3].num_tokens_generated: required field is missing"),
        ("prefix_cache_score", True, "rows[3].prefix_cache_score: must be a number"),
    ],
)
async def test_bulk_is_all_or_nothing(
    server: PredictionServer, http: aiohttp.ClientSession, field: str, value: Any, message: str
) -> None:
    rows = feature_rows(*synthetic(6)[::2])
    if value is None:
        del rows[3][field]
    else:
        rows[3][field] = value
    status, error = await post(http, server.url + "/v1/predict/bulk", {"rows": rows})
    assert status == 400
    assert error["error"]["message"].startswith(message)
    assert "predictions" not in error


async def test_row_limit(server: PredictionServer, http: aiohttp.ClientSession) -> None:
    rows = feature_rows(*synthetic(10_000, seed=9)[::2])
    status, body = await post(http, server.url + "/v1/predict/bulk", {"rows": rows})
    assert status == 200 and len(body["predictions"]) == 10_000
    status, error = await post(http, server.url + "/v1/predict/bulk", {"rows": [*rows, rows[0]]})
    assert status == 413
    assert "10001 rows; at most 10000" in error["error"]["message"]
    status, error = await post(http, server.url + "/v1/predict/bulk", b" " * (17 * 1024 * 1024))
    assert status == 413


async def test_reloads_only_when_the_version_changes(
    server: PredictionServer, model_dir: Path, http: aiohttp.ClientSession
) -> None:
    loads: list[str] = []
    original = server.predictor._prepare

    def spy(kind: Any, raw: bytes, metadata: Any) -> Any:
        loads.append(metadata.version)
        return original(kind, raw, metadata)

    server.predictor._prepare = spy  # type: ignore[method-assign]
    polls = server.metrics.sync_errors._value.get()
    for _ in range(5):
        await server.sync_now()
    assert loads == [] and server.metrics.sync_errors._value.get() == polls

    versions = republish(model_dir, "v2", kinds=("ttft",))
    await eventually(lambda: loads == [versions["ttft"]])
    for _ in range(5):
        await server.sync_now()
    assert loads == [versions["ttft"]]
    rows = feature_rows(*synthetic(1)[::2])
    status, body = await post(http, server.url + "/v1/predict/bulk", {"rows": rows})
    assert status == 200 and body["model_versions"]["ttft"] == versions["ttft"]
    async with http.get(server.url + "/metrics") as r:
        text = await r.text()
    assert f'slorouter_prediction_model_version_info{{model="ttft",version="{versions["ttft"]}"}} 1.0' in text
    assert 'slorouter_prediction_requests_total{endpoint="bulk",status="200"} 1.0' in text


async def test_ttft_only_gives_null_tpot(
    trained_dir: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    directory = copy_models(trained_dir, tmp_path / "ttft-only", kinds=("ttft",))
    server = PredictionServer(make_source(model_dir=str(directory)), poll_interval_s=0.02)
    await server.start()
    try:
        await eventually(lambda: server.ready)
        rows = feature_rows(*synthetic(2)[::2])
        status, body = await post(http, server.url + "/v1/predict/bulk", {"rows": rows})
        assert status == 200
        assert [p["tpot_ms"] for p in body["predictions"]] == [None, None]
        assert all(p["ttft_ms"] > 0 for p in body["predictions"])
        assert set(body["model_versions"]) == {"ttft"}
    finally:
        await server.stop()


async def test_models_polled_from_the_training_server(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    training = TrainingServer(tmp_path / "training-models", trainer_config=FAST_TRAINING)
    await training.start()
    prediction = PredictionServer(make_source(training_server=training.url), poll_interval_s=0.02)
    await prediction.start()
    try:
        await prediction.wait_synced()
        assert not prediction.ready
        async with http.post(training.url + "/v1/samples", json=samples_request(samples_body(300))) as r:
            assert r.status == 202
        await eventually(
            lambda: (
                all(prediction.predictor.versions.values())
                and prediction.predictor.versions
                == {k: training.trainer.current_version(k) for k in ("ttft", "tpot")}
            )
        )
        rows = feature_rows(*synthetic(4, seed=2)[::2])
        status, body = await post(http, prediction.url + "/v1/predict/bulk", {"rows": rows})
        assert status == 200
        ttft, _ = expected(training.model_dir, rows)
        np.testing.assert_allclose([p["ttft_ms"] for p in body["predictions"]], ttft, atol=1e-3)

        # Later polls are answered 304 Not Modified: nothing is downloaded or loaded again.
        reloads = prediction.metrics.reloads._value.get()
        for _ in range(3):
            assert await prediction.sync_now() is False
        assert prediction.metrics.reloads._value.get() == reloads
        async with http.get(training.url + "/metrics") as r:
            text = await r.text()
        assert 'slorouter_training_model_requests_total{model="ttft",status="304"}' in text
        async with http.get(prediction.url + "/v1/status") as r:
            status_body = await r.json()
        assert status_body["source"] == {
            "type": "training-server",
            "url": training.url,
            "max_model_bytes": 256 << 20,
        }
    finally:
        await prediction.stop()
        await training.stop()


async def test_training_server_down_keeps_serving_the_loaded_model(
    trained_dir: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    training = TrainingServer(copy_models(trained_dir, tmp_path / "models"), trainer_config=FAST_TRAINING)
    await training.start()
    prediction = PredictionServer(make_source(training_server=training.url), poll_interval_s=0.02)
    await prediction.start()
    try:
        await eventually(lambda: prediction.ready)
        await training.stop()
        assert await prediction.sync_now() is False
        assert prediction.last_sync_error is not None
        rows = feature_rows(*synthetic(2)[::2])
        status, _ = await post(http, prediction.url + "/v1/predict/bulk", {"rows": rows})
        assert status == 200
    finally:
        await prediction.stop()
        await training.stop()


def test_source_choice_is_exclusive() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        make_source()
    with pytest.raises(ValueError, match="exactly one"):
        make_source(model_dir="/tmp/x", training_server="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="poll_interval_s"):
        PredictionServer(make_source(model_dir="/tmp/x"), poll_interval_s=0)


@pytest.mark.parametrize("pod_class", [False, True])
def test_fast_row_path_agrees_with_the_library(pod_class: bool) -> None:
    schema = FeatureSchema(pod_class=pod_class)
    fast = JsonRows(schema)
    rng = np.random.default_rng(11)
    x_ttft, _, x_tpot, _ = synthetic(50, seed=11)
    base = feature_rows(x_ttft, x_tpot)
    if pod_class:
        base = [{**row, "pod_class": float(rng.integers(0, 5))} for row in base]
    mutations: list[Any] = [
        None,
        ("kv_cache_percentage", 1.0000001),
        ("kv_cache_percentage", -0.0),
        ("prefix_cache_score", 1),
        ("num_request_waiting", True),
        ("num_request_waiting", "1"),
        ("input_token_length", -1e-9),
        ("input_token_length", 1e16),
        ("input_token_length", 10**400),
        ("decode_tokens_in_flight", float("inf")),
        ("effective_input_tokens", "drop"),
        ("num_tokens_generated", "drop"),
        ("num_tokens_generated", None),
        ("pod_class", 1.5),
        ("pod_class", 2.0**24),
    ]
    for mutation in mutations:
        rows = [dict(row) for row in base]
        if mutation is not None:
            field, value = mutation
            target = rows[int(rng.integers(0, len(rows)))]
            if value == "drop":
                target.pop(field, None)
            else:
                target[field] = value
        try:
            expected_matrices: Any = rows_to_matrices(rows, schema=schema)
        except (FeatureError, OverflowError):
            expected_matrices = None
        got = fast(rows)
        if got is None:
            continue  # the server then runs the library's path: same outcome by construction
        assert expected_matrices is not None, mutation
        assert got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_array_equal(split_union(got, schema)[0], expected_matrices[0])
        np.testing.assert_array_equal(split_union(got, schema)[1], expected_matrices[1])
    assert fast(base) is not None


def split_union(matrix: np.ndarray, schema: FeatureSchema) -> tuple[np.ndarray, np.ndarray]:
    """The TTFT and TPOT matrices within rows of the union of the features (``schema.all_features()``)."""
    names = schema.all_features()
    ttft, tpot = ([names.index(n) for n in schema.features(kind)] for kind in ("ttft", "tpot"))
    return matrix[:, ttft], matrix[:, tpot]


# -- the binary bulk format ----------------------------------------------------------------------------------

BINARY_HEADERS = {"Content-Type": BINARY_ROWS_TYPE, FEATURE_NAMES_HEADER: ",".join(RowEncoder().names)}


async def post_binary(
    http: aiohttp.ClientSession, url: str, matrix: np.ndarray, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    body = np.ascontiguousarray(matrix, dtype="<f4").tobytes()
    async with http.post(url, data=body, headers=headers or BINARY_HEADERS) as response:
        return response.status, dict(response.headers), await response.read()


def union(x_ttft: np.ndarray, x_tpot: np.ndarray) -> np.ndarray:
    return np.hstack([x_ttft, x_tpot[:, -1:]])


async def test_binary_bulk_gives_the_predictors_exact_values(
    server: PredictionServer, model_dir: Path, http: aiohttp.ClientSession
) -> None:
    x_ttft, _, x_tpot, _ = synthetic(300, seed=21)
    status, headers, body = await post_binary(http, server.url + "/v1/predict/bulk", union(x_ttft, x_tpot))
    assert status == 200 and headers["Content-Type"] == BINARY_PREDICTIONS_TYPE
    ttft, tpot = decode_binary_predictions(body, 300)
    want_ttft, want_tpot = expected(model_dir, feature_rows(x_ttft, x_tpot))
    np.testing.assert_array_equal(ttft, want_ttft)  # not rounded: the float64 values themselves
    np.testing.assert_array_equal(tpot, want_tpot)
    store = ModelStore(model_dir)
    assert json.loads(headers[MODEL_VERSIONS_HEADER]) == {
        k: store.latest_version(k) for k in ("ttft", "tpot")
    }

    # Columns in another order, an extra column, effective_input_tokens left out (derived): same answers.
    names = [*[n for n in RowEncoder().names if n != "effective_input_tokens"][::-1], "extra"]
    rows = feature_rows(x_ttft, x_tpot)
    matrix = np.array([[row.get(n, 7.0) for n in names] for row in rows], dtype=np.float32)
    headers_other = {"Content-Type": BINARY_ROWS_TYPE, FEATURE_NAMES_HEADER: ", ".join(names)}
    status, _, body = await post_binary(http, server.url + "/v1/predict/bulk", matrix, headers_other)
    assert status == 200
    np.testing.assert_allclose(decode_binary_predictions(body, 300)[0], want_ttft, rtol=1e-4)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        (0, 1.5, "rows[3].kv_cache_percentage: must be between 0 and 1, got 1.5"),
        (2, -1.0, "rows[3].num_request_waiting: must be >= 0"),
        (5, float("nan"), "rows[3].decode_tokens_in_flight: must be finite"),
        (8, float("inf"), "rows[3].num_tokens_generated: must be finite"),
    ],
)
async def test_binary_bulk_names_the_bad_row_and_field_like_json(
    server: PredictionServer, http: aiohttp.ClientSession, column: int, value: float, message: str
) -> None:
    x_ttft, _, x_tpot, _ = synthetic(6, seed=22)
    matrix = union(x_ttft, x_tpot)
    matrix[3, column] = value
    matrix[5, 0] = 2.0  # a later bad row is not the one named
    status, _, body = await post_binary(http, server.url + "/v1/predict/bulk", matrix)
    assert status == 400
    assert json.loads(body)["error"]["message"].startswith(message)


async def test_binary_bulk_refuses_malformed_bodies(
    server: PredictionServer, http: aiohttp.ClientSession
) -> None:
    url = server.url + "/v1/predict/bulk"
    x_ttft, _, x_tpot, _ = synthetic(4, seed=23)
    matrix = union(x_ttft, x_tpot)
    cases: list[tuple[bytes, dict[str, str], int, str]] = [
        (matrix.tobytes(), {"Content-Type": BINARY_ROWS_TYPE}, 400, FEATURE_NAMES_HEADER),
        (matrix.tobytes()[:-4], BINARY_HEADERS, 400, "whole rows of 9 float32 values"),
        (
            matrix[:, :8].tobytes(),
            {**BINARY_HEADERS, FEATURE_NAMES_HEADER: ",".join(RowEncoder().names[:8])},
            400,
            "lacks required feature(s): num_tokens_generated",
        ),
        (
            matrix.tobytes(),
            {
                **BINARY_HEADERS,
                FEATURE_NAMES_HEADER: ",".join([*RowEncoder().names[:8], "kv_cache_percentage"]),
            },
            400,
            "names a column twice",
        ),
        (np.zeros((10_001, 9), dtype="<f4").tobytes(), BINARY_HEADERS, 413, "10001 rows; at most 10000"),
    ]
    for body, headers, status, message in cases:
        async with http.post(url, data=body, headers=headers) as response:
            assert response.status == status, message
            assert message in (await response.json())["error"]["message"]


async def test_binary_bulk_with_only_a_ttft_model_gives_nan_tpot(
    trained_dir: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    directory = copy_models(trained_dir, tmp_path / "ttft-only", kinds=("ttft",))
    server = PredictionServer(make_source(model_dir=str(directory)), poll_interval_s=0.02)
    await server.start()
    try:
        await eventually(lambda: server.ready)
        x_ttft, _, x_tpot, _ = synthetic(3, seed=24)
        status, headers, body = await post_binary(
            http, server.url + "/v1/predict/bulk", union(x_ttft, x_tpot)
        )
        assert status == 200 and json.loads(headers[MODEL_VERSIONS_HEADER]).keys() == {"ttft"}
        ttft, tpot = decode_binary_predictions(body, 3)
        assert np.all(ttft > 0) and np.all(np.isnan(tpot))
    finally:
        await server.stop()


@pytest.mark.parametrize("pod_class", [False, True])
def test_union_rows_go_in_the_wire_order_and_come_back_as_the_union(pod_class: bool) -> None:
    schema = FeatureSchema(pod_class=pod_class)
    wire = RowEncoder(schema)
    # The TTFT model's features, then the TPOT model's others: with pod_class, not all_features() order.
    assert wire.names == (*schema.features("ttft"), "num_tokens_generated")
    x_ttft, _, x_tpot, _ = synthetic(40, seed=26)
    x_all = np.hstack([x_ttft, x_tpot[:, 6:7]])
    if pod_class:
        x_all = np.hstack([x_all, (np.arange(40, dtype=np.float32) % 3)[:, None]])
    union = schema.all_features()
    body = wire.encode_binary(x_all)
    assert body == np.ascontiguousarray(x_all[:, [union.index(n) for n in wire.names]], dtype="<f4").tobytes()
    np.testing.assert_array_equal(BinaryRows(schema)(body, ",".join(wire.names).encode(), 10_000), x_all)


@pytest.mark.parametrize("pod_class", [False, True])
def test_binary_rows_agree_with_the_library(pod_class: bool) -> None:
    schema = FeatureSchema(pod_class=pod_class)
    binary = BinaryRows(schema)
    x_ttft, _, x_tpot, _ = synthetic(40, seed=25)
    rows = feature_rows(x_ttft, x_tpot)
    if pod_class:
        rows = [{**row, "pod_class": float(i % 3)} for i, row in enumerate(rows)]
    names = list(schema.all_features())
    header = ",".join(names).encode()

    def body(rows: list[dict[str, float]]) -> bytes:
        return np.array([[row[n] for n in names] for row in rows], dtype="<f4").tobytes()

    got = binary(body(rows), header, 10_000)
    want = rows_to_matrices(rows, schema=schema)
    np.testing.assert_array_equal(split_union(got, schema)[0], want[0])
    np.testing.assert_array_equal(split_union(got, schema)[1], want[1])
    # effective_input_tokens left out: derived as the library derives it
    names_without = [n for n in names if n != "effective_input_tokens"]
    derived = binary(
        np.array([[row[n] for n in names_without] for row in rows], dtype="<f4").tobytes(),
        ",".join(names_without).encode(),
        10_000,
    )
    without = [{k: v for k, v in row.items() if k != "effective_input_tokens"} for row in rows]
    np.testing.assert_array_equal(
        split_union(derived, schema)[0], rows_to_matrices(without, schema=schema)[0]
    )
    if pod_class:
        bad = [dict(row) for row in rows]
        bad[7]["pod_class"] = 1.5
        with pytest.raises(FeatureError, match=r"rows\[7\]\.pod_class: must be an integer code"):
            binary(body(bad), header, 10_000)


def test_bulk_response_bytes_are_the_documented_json() -> None:
    import orjson

    rng = np.random.default_rng(3)
    for n in (1, 2, 100):
        ttft = rng.lognormal(5, 2, n) * rng.choice([1.0, 1e-9, 1e12], n)
        tpot = rng.lognormal(3, 1, n)
        tpot[:: max(1, n // 3)] = np.nan  # no TPOT model yet: null
        body = encode_predictions(ttft, tpot, {})
        predictions = [
            {"ttft_ms": a, "tpot_ms": None if b != b else b}
            for a, b in zip(np.round(ttft, 3).tolist(), np.round(tpot, 3).tolist(), strict=True)
        ]
        assert body == orjson.dumps({"predictions": predictions, "model_versions": {}})
        assert json.loads(body)["predictions"] == predictions
