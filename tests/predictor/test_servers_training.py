"""The training server on 127.0.0.1: ingestion and its validation, training cadence, model download."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from slorouter.clock import ManualClock
from slorouter.predictor.features import DEFAULT_SCHEMA
from slorouter.predictor.live_check import LIVE_SAMPLES
from slorouter.predictor.model_store import decode_model_file
from slorouter.predictor.pool_shape import PoolShape
from slorouter.predictor.sample_sink import TrainingSampleSink
from slorouter.predictor.training_server import MODEL_METADATA_HEADER, TrainingServer
from tests.helpers import predictor_models as common
from tests.helpers.predictor_models import (
    FAST_TRAINING,
    SAMPLES_SCHEMA,
    eventually,
    samples_body,
    samples_request,
    synthetic,
)

http = common.http


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[TrainingServer]:
    training = TrainingServer(
        tmp_path / "models", trainer_config=FAST_TRAINING, max_samples_per_request=50, max_body_bytes=100_000
    )
    await training.start()
    try:
        yield training
    finally:
        await training.stop()


async def post_samples(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(url + "/v1/samples", data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


async def test_a_router_may_ask_a_retrain_with_its_samples(tmp_path: Path, http: aiohttp.ClientSession):
    # An hour between trainings: only the router's ask brings the second one.
    slow = replace(FAST_TRAINING, retrain_interval_s=3600.0)
    training = TrainingServer(tmp_path / "models", trainer_config=slow, train_poll_interval_s=0.02)
    await training.start()
    try:
        for seed in range(10):
            status, _ = await post_samples(http, training.url, samples_request(samples_body(20, seed)))
            assert status == 202

        def trainings(kind: str) -> int:
            return int(training.trainer.status()["models"][kind]["trainings"])

        await eventually(lambda: trainings("ttft") == 1)
        body = {**samples_request(samples_body(20, 99)), "retrain": ["ttft"]}
        status, _ = await post_samples(http, training.url, body)
        assert status == 202
        await eventually(lambda: trainings("ttft") == 2)
        assert trainings("tpot") == 1
    finally:
        await training.stop()


async def test_accepts_samples_of_both_models(server: TrainingServer, http: aiohttp.ClientSession) -> None:
    samples = samples_body(10)
    status, body = await post_samples(http, server.url, samples_request(samples))
    assert (status, body) == (202, {"accepted": 20, "model_versions": {}})  # none published yet
    assert server.store.count("ttft") == 10 and server.store.count("tpot") == 10
    status, body = await post_samples(http, server.url, samples_request([], extra="ignored"))
    assert (status, body) == (202, {"accepted": 0, "model_versions": {}})
    async with http.get(server.url + "/v1/status") as r:
        status_body = await r.json()
    assert status_body["models"]["ttft"]["samples"] == 10
    assert sum(status_body["models"]["tpot"]["buckets"].values()) == 10
    assert status_body["model_versions"] == {"ttft": None, "tpot": None}


def _valid() -> list[dict[str, Any]]:
    return samples_body(2)  # ttft, ttft, tpot, tpot


def _with(index: int, path: tuple[str, ...], value: Any) -> list[dict[str, Any]]:
    samples = copy.deepcopy(_valid())
    target: Any = samples
    for key in (index, *path[:-1]):
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return samples


_DELETE = object()

BAD_BODIES = [
    pytest.param(b"{not json", "not valid JSON", id="not-json"),
    pytest.param(
        b'{"samples": [{"model": "ttft", "features": {}, "latency_ms": NaN}]}', "NaN", id="nan-literal"
    ),
    pytest.param([1, 2], "must be a JSON object", id="body-list"),
    pytest.param({"schema": SAMPLES_SCHEMA, "entries": []}, '"samples" must be a list', id="no-samples"),
    pytest.param({"samples": _valid()}, '"schema" is required: the feature schema', id="no-schema"),
    pytest.param(
        {"schema": {**SAMPLES_SCHEMA, "version": 1}, "samples": _valid()},
        '"schema.version" is 1, but this server\'s feature schema is version 2',
        id="other-schema-version",
    ),
    pytest.param(
        {"schema": {**SAMPLES_SCHEMA, "pod_class": True}, "samples": _valid()},
        '"schema.pod_class" is true, but this server\'s is false',
        id="other-pod-class",
    ),
    pytest.param(samples_request(_valid(), pool_shape=[16]), '"pool_shape": invalid pool shape', id="shape"),
    pytest.param(
        samples_request(_valid(), pool_shape={"kv_caches": [{"block_size": 16, "num_gpu_blocks": -1}]}),
        '"pool_shape": invalid pool shape',
        id="shape-negative",
    ),
    pytest.param(samples_request({"a": 1}), '"samples" must be a list', id="samples-object"),
    pytest.param(samples_request([*_valid(), 7]), "samples[4]: must be an object", id="sample-not-object"),
    pytest.param(
        samples_request(_with(1, ("model",), "e2e")), "samples[1].model: must be one of", id="model"
    ),
    pytest.param(samples_request(_with(3, ("model",), _DELETE)), "samples[3].model", id="model-missing"),
    pytest.param(
        samples_request(_with(2, ("features",), [1, 2])), "samples[2].features: must be an object", id="feat"
    ),
    pytest.param(
        samples_request(_with(1, ("latency_ms",), -1)), "samples[1].latency_ms: must be a positive", id="neg"
    ),
    pytest.param(samples_request(_with(1, ("latency_ms",), 0)), "samples[1].latency_ms", id="zero-latency"),
    pytest.param(
        samples_request(_with(1, ("latency_ms",), True)), "samples[1].latency_ms", id="bool-latency"
    ),
    pytest.param(samples_request(_with(1, ("latency_ms",), "12")), "samples[1].latency_ms", id="str-latency"),
    pytest.param(
        samples_request(_with(0, ("latency_ms",), _DELETE)), "samples[0].latency_ms", id="no-latency"
    ),
    pytest.param(
        samples_request(_with(3, ("features", "kv_cache_percentage"), 1.7)),
        "samples[3].features.kv_cache_percentage: must be between 0 and 1, got 1.7",
        id="kv-range",
    ),
    pytest.param(
        samples_request(_with(1, ("features", "input_token_length"), _DELETE)),
        "samples[1].features.input_token_length: required field is missing",
        id="missing-feature",
    ),
    pytest.param(
        samples_request(_with(2, ("features", "num_tokens_generated"), _DELETE)),
        "samples[2].features.num_tokens_generated: required field is missing",
        id="missing-tpot-feature",
    ),
    pytest.param(
        samples_request(_with(1, ("features", "num_request_waiting"), "3")),
        "samples[1].features.num_request_waiting: must be a number",
        id="string-feature",
    ),
    pytest.param(
        samples_request(_with(0, ("features", "num_request_running"), -2)),
        "samples[0].features.num_request_running: must be >= 0",
        id="negative-feature",
    ),
    pytest.param(
        {**samples_request(samples_body(2)), "retrain": ["ttft", "e2e"]},
        '"retrain": must be a list of model kinds (ttft, tpot)',
        id="retrain-kind",
    ),
    pytest.param(
        {**samples_request(samples_body(2)), "retrain": "ttft"},
        '"retrain": must be a list of model kinds',
        id="retrain-not-a-list",
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
async def test_invalid_samples_are_rejected_whole(
    server: TrainingServer, http: aiohttp.ClientSession, body: Any, message: str
) -> None:
    status, error = await post_samples(http, server.url, body)
    assert status == 400, error
    assert message in error["error"]["message"], error
    assert error["error"]["type"] == "BadRequestError"
    # All or nothing: the valid samples before and after the bad one were not stored either.
    assert server.store.count("ttft") == 0 and server.store.count("tpot") == 0


FULL_SCHEMA = DEFAULT_SCHEMA.to_dict()

BAD_SCHEMAS = [
    pytest.param([2, False], "schema", '"schema" must be an object', id="list"),
    pytest.param({**FULL_SCHEMA, "columns": []}, "schema", "no member 'columns'", id="unknown-member"),
    pytest.param({"pod_class": False}, "schema.version", '"schema.version" is required', id="no-version"),
    pytest.param({"version": 2}, "schema.pod_class", '"schema.pod_class" is required', id="no-pod-class"),
    pytest.param(
        {**SAMPLES_SCHEMA, "version": "2"}, "schema.version", "must be an integer", id="version-str"
    ),
    pytest.param({**SAMPLES_SCHEMA, "pod_class": 0}, "schema.pod_class", "true or false", id="pod-class-int"),
    pytest.param(
        {k: v for k, v in FULL_SCHEMA.items() if k != "tpot"},
        "schema.tpot",
        '"schema.tpot" is required with "schema.ttft"',
        id="one-list",
    ),
    pytest.param(
        {**FULL_SCHEMA, "ttft": FULL_SCHEMA["ttft"][:-1]},
        "schema.ttft",
        '"schema.ttft" must list this server\'s ttft features',
        id="other-ttft-list",
    ),
]


@pytest.mark.parametrize(("schema", "param", "message"), BAD_SCHEMAS)
async def test_bad_schemas_are_400_naming_the_problem(
    server: TrainingServer, http: aiohttp.ClientSession, schema: Any, param: str, message: str
) -> None:
    status, error = await post_samples(http, server.url, {"schema": schema, "samples": _valid()})
    assert status == 400 and error["error"]["param"] == param, error
    assert message in error["error"]["message"], error
    assert server.store.count("ttft") == 0


async def test_the_schema_of_the_status_is_accepted_back(
    server: TrainingServer, http: aiohttp.ClientSession
) -> None:
    """A client posts the schema object /v1/status reported, as well as its short form."""
    async with http.get(server.url + "/v1/status") as r:
        schema = (await r.json())["schema"]
    assert schema == FULL_SCHEMA and set(schema) > set(SAMPLES_SCHEMA)
    for claimed in (schema, SAMPLES_SCHEMA):
        status, body = await post_samples(http, server.url, {"schema": claimed, "samples": _valid()})
        assert (status, body) == (202, {"accepted": 4, "model_versions": {}})
    assert server.store.count("ttft") == 4


async def test_request_limits(server: TrainingServer, http: aiohttp.ClientSession) -> None:
    status, error = await post_samples(http, server.url, samples_request(samples_body(26)))  # 52 > 50 samples
    assert status == 413
    assert "at most 50" in error["error"]["message"]
    status, error = await post_samples(http, server.url, b'{"samples": [' + b" " * 200_000 + b"]}")
    assert status == 413
    assert "100000 bytes" in error["error"]["message"]
    assert server.store.count("ttft") == 0
    async with http.get(server.url + "/metrics") as r:
        text = await r.text()
    assert 'slorouter_training_sample_requests_rejected_total{status="413"} 2.0' in text


async def test_model_404_before_training(server: TrainingServer, http: aiohttp.ClientSession) -> None:
    for kind in ("ttft", "tpot"):
        async with http.get(f"{server.url}/v1/models/{kind}") as r:
            assert r.status == 404
            assert "no " + kind in (await r.json())["error"]["message"]
    async with http.get(f"{server.url}/v1/models/e2e") as r:
        assert r.status == 404
        assert "unknown model" in (await r.json())["error"]["message"]


async def test_trains_once_enough_samples_then_serves_models(
    server: TrainingServer, http: aiohttp.ClientSession
) -> None:
    status, _ = await post_samples(http, server.url, samples_request(samples_body(25, seed=1)))
    assert status == 202
    await eventually(lambda: server.trainer.status()["models"]["ttft"]["added_since_training"] == 25, 5)
    assert server.trainer.current_version("ttft") is None  # 25 < min_samples (200): no model, no stub

    for seed in range(2, 10):
        status, _ = await post_samples(http, server.url, samples_request(samples_body(25, seed=seed)))
        assert status == 202
    await eventually(lambda: all(server.trainer.current_version(k) for k in ("ttft", "tpot")))

    async with http.get(server.url + "/v1/models/ttft") as r:
        assert r.status == 200
        etag = r.headers["ETag"]
        metadata = json.loads(r.headers[MODEL_METADATA_HEADER])
        raw, decoded = decode_model_file(await r.read())
    assert etag == f'"{decoded.version}"' and metadata == decoded.to_dict()
    assert decoded.kind == "ttft" and decoded.sample_count > 0 and raw
    assert {"mape", "coverage", "pinball_loss"} <= set(decoded.metrics)

    for header, expected in [(etag, 304), (f"W/{etag}", 304), (f'"other", {etag}', 304), ('"other"', 200)]:
        async with http.get(server.url + "/v1/models/ttft", headers={"If-None-Match": header}) as r:
            assert r.status == expected, header
            assert r.headers["ETag"] == etag
    async with http.get(server.url + "/v1/models/ttft/metadata") as r:
        assert (await r.json())["version"] == decoded.version

    async with http.get(server.url + "/v1/status") as r:
        status_body = await r.json()
    assert status_body["model_versions"]["ttft"] == decoded.version
    assert status_body["models"]["ttft"]["last_training"]["accepted"] is True
    assert status_body["models"]["ttft"]["metrics"]["mape"] >= 0

    async with http.get(server.url + "/metrics") as r:
        text = await r.text()
    assert 'slorouter_training_runs_total{model="ttft",outcome="accepted"}' in text
    assert f'slorouter_training_model_version_info{{model="ttft",version="{decoded.version}"}} 1.0' in text
    assert 'slorouter_training_holdout_mape{model="ttft"}' in text
    assert 'slorouter_training_holdout_coverage{model="tpot"}' in text
    assert 'slorouter_training_samples_received_total{model="tpot"} 225.0' in text
    assert 'slorouter_training_model_requests_total{model="ttft",status="304"} 3.0' in text


async def test_training_runs_in_one_background_thread(tmp_path: Path) -> None:
    training = TrainingServer(tmp_path / "models", trainer_config=FAST_TRAINING)
    threads: set[str] = set()
    original = training.trainer.maybe_train

    def spy() -> Any:
        threads.add(threading.current_thread().name)
        return original()

    training.trainer.maybe_train = spy  # type: ignore[method-assign]
    await training.start()
    try:
        await eventually(lambda: bool(threads))
    finally:
        await training.stop()
    assert threads == {"slorouter-trainer"}


async def test_probes_and_restart_keeps_models(server: TrainingServer, http: aiohttp.ClientSession) -> None:
    async with http.get(server.url + "/healthz") as r:
        assert (r.status, await r.json()) == (200, {"status": "ok"})
    async with http.get(server.url + "/readyz") as r:
        assert r.status == 200
    for seed in range(9):
        await post_samples(http, server.url, samples_request(samples_body(25, seed=seed)))
    await eventually(lambda: server.trainer.current_version("tpot") is not None)
    version = server.trainer.current_version("tpot")

    # A new server on the same directory publishes the models already there.
    restarted = TrainingServer(server.model_dir, trainer_config=replace(FAST_TRAINING, min_samples=10_000))
    await restarted.start()
    try:
        async with http.get(restarted.url + "/v1/models/tpot") as r:
            assert r.status == 200 and r.headers["ETag"] == f'"{version}"'
    finally:
        await restarted.stop()


H100 = {"kv_caches": [{"block_size": 16, "num_gpu_blocks": 29205}]}
H100_AND_A100 = {"kv_caches": [{"block_size": 16, "num_gpu_blocks": 17187}, *H100["kv_caches"]]}


async def previous_run(
    state_dir: Path, http: aiohttp.ClientSession, shape: dict[str, Any], scale: float = 1.0
) -> dict[str, Any]:
    """A training server's run on samples of ``shape``'s pool (latencies × ``scale``), trained and stopped;
    its model versions."""
    server = TrainingServer(state_dir / "models", state_dir=state_dir, trainer_config=FAST_TRAINING)
    await server.start()
    try:
        body = samples_request(samples_body(200, scale=scale), pool_shape=shape)
        status, _ = await post_samples(http, server.url, body)
        assert status == 202
        await eventually(lambda: all(server.trainer.current_version(k) for k in ("ttft", "tpot")))
    finally:
        await server.stop()
    return {kind: server.trainer.current_version(kind) for kind in ("ttft", "tpot")}


async def test_restart_takes_over_state_that_fits_the_routers_pool(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    versions = await previous_run(tmp_path / "state", http, H100_AND_A100)
    server = TrainingServer(
        tmp_path / "state" / "models", state_dir=tmp_path / "state", trainer_config=FAST_TRAINING
    )
    await server.start()
    try:
        assert server.store.count("ttft") == 200 and server.status()["model_versions"] == versions
        # A router whose A100 replicas are down: its pool still fits.
        status, _ = await post_samples(
            http, server.url, samples_request(samples_body(5, seed=1), pool_shape=H100)
        )
        assert status == 202 and server.store.count("ttft") == 205
        async with http.get(server.url + "/v1/models/ttft") as r:
            assert r.status == 200 and r.headers["ETag"] == f'"{versions["ttft"]}"'
        assert server.status()["pool_shape"] == H100_AND_A100
        assert server.status()["state"]["warm_start"]["refused"] == []
    finally:
        await server.stop()


async def test_restart_refuses_state_of_another_pool_once_a_router_says(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    versions = await previous_run(tmp_path / "state", http, H100)
    server = TrainingServer(
        tmp_path / "state" / "models", state_dir=tmp_path / "state", trainer_config=FAST_TRAINING
    )
    await server.start()
    try:
        async with http.get(server.url + "/v1/models/ttft") as r:
            assert r.status == 200  # published at once: the pool is not known before a router says
        status, _ = await post_samples(
            http, server.url, samples_request(samples_body(5, seed=1), pool_shape=H100_AND_A100)
        )
        assert status == 202
        assert server.store.count("ttft") == 5  # the restored samples are gone, the new ones kept
        assert server.trainer.current_version("ttft") is None  # no baseline: the next model is a first one
        for kind in ("ttft", "tpot"):
            async with http.get(f"{server.url}/v1/models/{kind}") as r:
                assert r.status == 404  # withheld until a new training replaces it
        status_body = server.status()
        assert status_body["pool_shape"] == H100_AND_A100 and status_body["model_versions"] == dict.fromkeys(
            versions
        )
        refused = [(r["item"], r["kind"], r["reason"]) for r in status_body["state"]["warm_start"]["refused"]]
        assert refused == [
            ("model", "ttft", "pool_shape"),
            ("model", "tpot", "pool_shape"),
            ("samples", "all", "pool_shape"),
        ]
        async with http.get(server.url + "/metrics") as r:
            text = await r.text()
        assert 'slorouter_training_warm_start_refused_total{item="model",reason="pool_shape"} 2.0' in text
        assert 'slorouter_training_warm_start_refused_total{item="samples",reason="pool_shape"} 1.0' in text
        assert "slorouter_training_model_version_info{" not in text
        status, _ = await post_samples(
            http, server.url, samples_request(samples_body(200, seed=2), pool_shape=H100)
        )
        await eventually(lambda: server.trainer.current_version("ttft") is not None)
        async with http.get(server.url + "/v1/models/ttft") as r:
            assert r.status == 200 and r.headers["ETag"] != f'"{versions["ttft"]}"'
    finally:
        await server.stop()


async def test_a_damaged_window_is_refused_and_training_starts_over(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    await previous_run(tmp_path / "state", http, H100)
    (tmp_path / "state" / "samples.window").write_bytes(b"SLOROUTER-SAMPLES/1\n\x00\x00")
    server = TrainingServer(
        tmp_path / "state" / "models", state_dir=tmp_path / "state", trainer_config=FAST_TRAINING
    )
    await server.start()
    try:
        assert server.store.count("ttft") == 0 and all(server.status()["model_versions"].values())
        (refusal,) = server.status()["state"]["warm_start"]["refused"]
        assert (refusal["item"], refusal["reason"]) == ("samples", "damaged")
    finally:
        await server.stop()


async def test_restart_refuses_stale_state(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    await previous_run(tmp_path / "state", http, H100)
    server = TrainingServer(
        tmp_path / "state" / "models",
        state_dir=tmp_path / "state",
        trainer_config=FAST_TRAINING,
        wall_clock=ManualClock(time.time() + 2 * 24 * 3600),
    )
    await server.start()
    try:
        assert server.store.count("ttft") == 0 and server.status()["model_versions"] == dict.fromkeys(
            ("ttft", "tpot")
        )
        refused = [
            (r["item"], r["kind"], r["reason"]) for r in server.status()["state"]["warm_start"]["refused"]
        ]
        assert refused == [
            ("model", "ttft", "stale"),
            ("model", "tpot", "stale"),
            ("samples", "all", "stale"),
        ]
        for kind in ("ttft", "tpot"):
            async with http.get(f"{server.url}/v1/models/{kind}") as r:
                assert r.status == 404  # neither baselines nor downloadable
        async with http.get(server.url + "/metrics") as r:
            text = await r.text()
        assert 'slorouter_training_warm_start_refused_total{item="model",reason="stale"} 2.0' in text
        assert "slorouter_training_model_version_info{" not in text
    finally:
        await server.stop()


async def test_restart_drops_state_the_first_live_samples_show_wrong(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    versions = await previous_run(tmp_path / "state", http, H100, scale=4.5)  # a slower pool, same shape
    server = TrainingServer(
        tmp_path / "state" / "models", state_dir=tmp_path / "state", trainer_config=FAST_TRAINING
    )
    await server.start()
    try:
        async with http.get(server.url + "/v1/models/ttft") as r:
            assert r.status == 200  # served until the live check
        body = samples_request(samples_body(LIVE_SAMPLES, seed=1), pool_shape=H100)
        assert (await post_samples(http, server.url, body))[0] == 202
        await eventually(lambda: len(server.status()["state"]["warm_start"]["refused"]) == 4)
        assert server.status()["model_versions"] == dict.fromkeys(versions)
        for kind in ("ttft", "tpot"):
            async with http.get(f"{server.url}/v1/models/{kind}") as r:
                assert r.status == 404
            assert server.store.count(kind) == LIVE_SAMPLES  # the restored samples are gone
        warm_start = server.status()["state"]["warm_start"]
        assert {kind: check["state"] for kind, check in warm_start["live_checks"].items()} == {
            "ttft": "dropped",
            "tpot": "dropped",
        }
        assert [(r["item"], r["kind"], r["reason"]) for r in warm_start["refused"]] == [
            ("model", "ttft", "inaccurate"),
            ("samples", "ttft", "inaccurate"),
            ("model", "tpot", "inaccurate"),
            ("samples", "tpot", "inaccurate"),
        ]

        async def unpublished() -> bool:  # the training thread withdraws the version series after the check
            async with http.get(server.url + "/metrics") as r:
                return "slorouter_training_model_version_info{" not in await r.text()

        await eventually(unpublished)
        async with http.get(server.url + "/metrics") as r:
            text = await r.text()
        assert 'slorouter_training_warm_start_refused_total{item="model",reason="inaccurate"} 2.0' in text
    finally:
        await server.stop()


async def test_the_routers_sink_declares_its_schema_and_pool(server: TrainingServer) -> None:
    sink = TrainingSampleSink(server.url, flush_interval_s=0.05, pool_shape=lambda: PoolShape.from_dict(H100))
    sink.start()
    try:
        await eventually(
            lambda: server.trainer.pool_shape == PoolShape.from_dict(H100), 5
        )  # before any sample
        x_ttft, y_ttft, _, _ = synthetic(3)
        for row, y in zip(x_ttft, y_ttft, strict=True):
            sink.add("ttft", row, float(y))
        await eventually(lambda: server.store.count("ttft") == 3, 5)
        assert sink.stats.rejected == 0
    finally:
        await sink.stop()
