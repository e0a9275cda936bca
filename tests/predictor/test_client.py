"""The router's client against real prediction servers on 127.0.0.1: coalescing, spreading, failover,
timeouts, and the bounded training-sample sink."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from slorouter.http.running import RunningServer, listen
from slorouter.predictor.backend import LatencyPredictorBackend, PredictionUnavailable
from slorouter.predictor.features import FeatureError
from slorouter.predictor.model_sources import make_source
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.prediction_client import PredictionClient, ServerState
from slorouter.predictor.prediction_server import PredictionServer
from slorouter.predictor.predictor import Predictor
from slorouter.predictor.remote import RemotePredictor
from slorouter.predictor.sample_sink import TrainingSampleSink, encode_sample, published_versions_in
from slorouter.predictor.training_server import TrainingServer
from slorouter.predictor.wire import RowEncoder, model_versions_in
from tests.helpers import predictor_models as common
from tests.helpers.predictor_models import FAST_TRAINING, eventually, feature_rows, matrices, synthetic, union
from tests.helpers.processes import free_port

trained_dir = common.trained_dir


def local_predictor(directory: Path) -> Predictor:
    predictor = Predictor(ModelStore(directory))
    predictor.refresh()
    return predictor


async def start_prediction_server(directory: Path, port: int = 0) -> PredictionServer:
    server = PredictionServer(make_source(model_dir=str(directory)), poll_interval_s=0.05)
    await server.start(port=port)
    await eventually(lambda: all(server.predictor.versions.values()))
    return server


def bulk_requests(server: PredictionServer) -> float:
    return server.metrics.requests.labels("bulk", "200")._value.get()


@pytest.fixture
async def servers(trained_dir: Path) -> AsyncIterator[list[PredictionServer]]:
    started = [await start_prediction_server(trained_dir) for _ in range(2)]
    try:
        yield started
    finally:
        for server in started:
            await server.stop()


@pytest.fixture
async def client_factory() -> AsyncIterator[Callable[..., PredictionClient]]:
    clients: list[PredictionClient] = []

    def make(urls: list[str], **options: object) -> PredictionClient:
        client = PredictionClient(urls, **options)  # type: ignore[arg-type]
        client.start()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.stop()


async def fake_server(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> RunningServer:
    app = web.Application()
    app.router.add_post("/v1/predict/bulk", handler)
    app.router.add_get("/readyz", handler)
    return await listen(app, "127.0.0.1", 0)


# -- coalescing ----------------------------------------------------------------------------------------------


async def test_concurrent_calls_are_coalesced_into_few_bulk_requests(
    servers: list[PredictionServer], trained_dir: Path, client_factory: Callable[..., PredictionClient]
) -> None:
    server = servers[0]
    client = client_factory([server.url], coalesce_window_s=0.005, timeout_s=5.0)
    calls = [union(10, seed) for seed in range(50)]
    before = bulk_requests(server)
    results = await asyncio.gather(*(client.predict(x_all) for x_all in calls))
    sent = bulk_requests(server) - before
    assert 1 <= sent <= 3, sent
    assert client.stats.bulk_requests == sent and client.stats.calls == 50 and client.stats.rows == 500

    local = local_predictor(trained_dir)
    for x_all, (ttft, tpot) in zip(calls, results, strict=True):
        want_ttft, want_tpot = local.predict_all(x_all)
        np.testing.assert_allclose(ttft, want_ttft, atol=1e-3)  # the server rounds to 1 µs
        np.testing.assert_allclose(tpot, want_tpot, atol=1e-3)


async def test_binary_and_json_wire_formats_agree(
    servers: list[PredictionServer], trained_dir: Path, client_factory: Callable[..., PredictionClient]
) -> None:
    x_all = union(200, seed=31)
    want_ttft, want_tpot = local_predictor(trained_dir).predict_all(x_all)
    binary = client_factory([servers[0].url], timeout_s=5.0)
    plain = client_factory([servers[0].url], timeout_s=5.0, binary=False)
    assert binary.binary and not plain.binary
    ttft, tpot = await binary.predict(x_all)
    np.testing.assert_array_equal(ttft, want_ttft)  # float64 on the wire: not even rounded
    np.testing.assert_array_equal(tpot, want_tpot)
    ttft[:] = 0.0  # results are the caller's own, writable arrays
    ttft, tpot = await plain.predict(x_all)
    np.testing.assert_allclose(ttft, want_ttft, atol=1e-3)  # JSON: rounded to 1 µs
    np.testing.assert_allclose(tpot, want_tpot, atol=1e-3)


async def test_window_zero_sends_each_call(
    servers: list[PredictionServer], client_factory: Callable[..., PredictionClient]
) -> None:
    client = client_factory([servers[0].url], coalesce_window_s=0, timeout_s=5.0)
    await asyncio.gather(*(client.predict(union(3, seed)) for seed in range(4)))
    assert client.stats.bulk_requests == 4


async def test_a_thousand_endpoint_pool_and_oversized_batches_are_split(
    servers: list[PredictionServer], trained_dir: Path, client_factory: Callable[..., PredictionClient]
) -> None:
    x_all = union(1000, seed=3)
    local_ttft, _ = local_predictor(trained_dir).predict_all(x_all)
    client = client_factory([servers[0].url], timeout_s=10.0)
    ttft, tpot = await client.predict(x_all)
    assert ttft.shape == tpot.shape == (1000,)
    np.testing.assert_allclose(ttft, local_ttft, atol=1e-3)
    assert client.stats.bulk_requests == 1

    split = client_factory([servers[0].url], timeout_s=10.0, max_rows_per_bulk=300)
    ttft, _ = await split.predict(x_all)
    np.testing.assert_allclose(ttft, local_ttft, atol=1e-3)
    assert split.stats.bulk_requests == 4  # 300 + 300 + 300 + 100 rows, in order


async def test_bulk_requests_spread_over_servers(
    servers: list[PredictionServer], client_factory: Callable[..., PredictionClient]
) -> None:
    client = client_factory([s.url for s in servers], coalesce_window_s=0, timeout_s=5.0)
    await asyncio.gather(*(client.predict(union(5, seed)) for seed in range(20)))
    counts = [bulk_requests(s) for s in servers]
    assert sum(counts) == 20 and min(counts) >= 5, counts


def test_pick_prefers_the_least_outstanding_ready_server() -> None:
    client = PredictionClient(["http://a", "http://b", "http://c"])
    a, b, c = client.servers
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 2
    assert client._pick(set()) is b
    b.ready = False
    assert client._pick(set()) is c
    assert client._pick({c}) is a
    a.ready = False
    assert client._pick({c}) is None
    assert ServerState("http://x").ready is None


def test_wire_numbers_round_trip_float32_exactly() -> None:
    rng = np.random.default_rng(3)
    wire = RowEncoder()
    for scale in (1e-7, 1.0, 1e3, 1e7):
        x_ttft = (rng.random((500, 8)) * scale).astype(np.float32)
        x_all = np.hstack([x_ttft, np.floor(rng.random((500, 1)) * 500)]).astype(np.float32)
        rows = json.loads(wire.encode(x_all))["rows"]
        back = np.array([[row[n] for n in wire.names] for row in rows], dtype=np.float64).astype(np.float32)
        np.testing.assert_array_equal(back, x_all)


async def test_wire_rows_are_keyed_by_feature_name() -> None:
    x_ttft, x_tpot = matrices(2)
    body = json.loads(RowEncoder().encode(union(2)))
    rows = feature_rows(x_ttft, x_tpot)
    assert list(body) == ["rows"] and len(body["rows"]) == 2
    for sent, row in zip(body["rows"], rows, strict=True):
        assert sent.keys() == row.keys()
        # Exact in float32, and short: counts as integers, fractions with 9 significant digits.
        assert [np.float32(v) for v in sent.values()] == [np.float32(v) for v in row.values()]
        assert isinstance(sent["input_token_length"], int) and isinstance(sent["kv_cache_percentage"], float)
        assert len(repr(sent["kv_cache_percentage"])) <= 11
    assert set(body["rows"][0]) == {
        "kv_cache_percentage",
        "input_token_length",
        "num_request_waiting",
        "num_request_running",
        "prefill_tokens_in_flight",
        "decode_tokens_in_flight",
        "prefix_cache_score",
        "effective_input_tokens",
        "num_tokens_generated",
    }


# -- failures ------------------------------------------------------------------------------------------------


async def test_failover_when_a_server_stops(
    servers: list[PredictionServer], client_factory: Callable[..., PredictionClient]
) -> None:
    first, second = servers
    client = client_factory([first.url, second.url], coalesce_window_s=0, timeout_s=5.0)
    await asyncio.gather(*(client.predict(union(4, seed)) for seed in range(6)))
    await first.stop()
    for seed in range(10):
        ttft, _ = await client.predict(union(4, seed))
        assert ttft.shape == (4,)
    assert client.servers[0].ready is False
    assert client.servers[0].last_error
    assert client.ready


async def test_a_restarted_server_is_probed_back_into_rotation(
    trained_dir: Path, client_factory: Callable[..., PredictionClient]
) -> None:
    port = free_port()
    server = await start_prediction_server(trained_dir, port)
    client = client_factory([server.url], coalesce_window_s=0, timeout_s=2.0, health_check_interval_s=0.05)
    await client.predict(union(2))
    await server.stop()
    with pytest.raises(PredictionUnavailable):
        await client.predict(union(2))
    with pytest.raises(PredictionUnavailable, match="no ready prediction server"):
        await client.predict(union(2))
    assert not client.ready
    server = await start_prediction_server(trained_dir, port)
    try:
        await eventually(lambda: client.ready)
        ttft, _ = await client.predict(union(2))
        assert ttft.shape == (2,)
    finally:
        await server.stop()


async def test_timeout_raises_prediction_unavailable(client_factory: Callable[..., PredictionClient]) -> None:
    async def slow(request: web.Request) -> web.Response:
        if request.method == "POST":
            await asyncio.sleep(5)
        return web.json_response({"status": "ready"})

    server = await fake_server(slow)
    try:
        client = client_factory([server.url], timeout_s=0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(PredictionUnavailable, match="within 50 ms"):
            await client.predict(union(3))
        assert loop.time() - started < 4  # a bound well below the server's 5 s, not a speed claim
        assert client.stats.unavailable == 1
        assert client.servers[0].ready is not False  # slow is not down
    finally:
        await server.close()


async def test_not_ready_and_failing_servers(client_factory: Callable[..., PredictionClient]) -> None:
    async def not_ready(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no trained model"}}, status=503)

    async def broken(request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.json_response({"status": "ready"})
        return web.Response(body=b'{"predictions": [1]}', content_type="application/json")

    first, second = await fake_server(not_ready), await fake_server(broken)
    try:
        client = client_factory([first.url, second.url], coalesce_window_s=0, timeout_s=2.0)
        with pytest.raises(PredictionUnavailable):
            await client.predict(union(3))
        assert client.stats.failovers == 1
        assert client.servers[0].ready is False  # its /readyz says 503 too
        assert "HTTP 503" in (client.servers[0].last_error or "")
        assert "malformed response" in (client.servers[1].last_error or "")
        assert client.servers[1].errors == 1
    finally:
        await first.close()
        await second.close()


async def test_rows_refused_by_the_server_are_not_retried_elsewhere(
    client_factory: Callable[..., PredictionClient],
) -> None:
    hits = 0

    async def refuse(request: web.Request) -> web.Response:
        nonlocal hits
        if request.method == "POST":
            hits += 1
            return web.json_response({"error": {"message": "rows[0].kv_cache_percentage: bad"}}, status=400)
        return web.json_response({"status": "ready"})

    first, second = await fake_server(refuse), await fake_server(refuse)
    try:
        client = client_factory([first.url, second.url], coalesce_window_s=0, timeout_s=2.0)
        with pytest.raises(PredictionUnavailable, match="rejected the rows"):
            await client.predict(union(1))
        assert hits == 1
        assert all(s.ready is not False for s in client.servers)
    finally:
        await first.close()
        await second.close()


async def test_input_errors_are_the_callers(client_factory: Callable[..., PredictionClient]) -> None:
    client = client_factory(["http://127.0.0.1:9"])
    x_all = union(2)
    with pytest.raises(ValueError, match="9 features"):
        await client.predict(x_all[:, :3])
    with pytest.raises(ValueError, match="9 features"):
        await client.predict(x_all[0])
    bad = x_all.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        await client.predict(bad)
    ttft, tpot = await client.predict(x_all[:0])
    assert ttft.shape == tpot.shape == (0,)
    with pytest.raises(ValueError):
        PredictionClient([])
    with pytest.raises(RuntimeError, match="start"):
        await PredictionClient(["http://x"]).predict(x_all)


async def test_stop_fails_pending_calls(client_factory: Callable[..., PredictionClient]) -> None:
    client = client_factory(["http://127.0.0.1:9"], coalesce_window_s=10, timeout_s=20)
    call = asyncio.ensure_future(client.predict(union(1)))
    await asyncio.sleep(0.01)
    await client.stop()
    with pytest.raises(PredictionUnavailable, match="stopping"):
        await call


async def test_client_metrics(
    servers: list[PredictionServer], client_factory: Callable[..., PredictionClient]
) -> None:
    registry = CollectorRegistry()
    client = client_factory([servers[0].url], coalesce_window_s=0, timeout_s=5.0, registry=registry)
    await client.predict(union(2))
    assert registry.get_sample_value("slorouter_prediction_client_calls_total", {"outcome": "ok"}) == 1
    assert (
        registry.get_sample_value(
            "slorouter_prediction_client_bulk_requests_total", {"server": servers[0].url, "outcome": "ok"}
        )
        == 1
    )


# -- training samples ----------------------------------------------------------------------------------------


def sample_row(seed: int = 0) -> dict[str, float]:
    return feature_rows(*matrices(1, seed)[::1])[0]


async def test_sink_buffer_is_bounded_with_a_dead_training_server() -> None:
    registry = CollectorRegistry()
    sink = TrainingSampleSink(
        f"http://127.0.0.1:{free_port()}",
        flush_interval_s=0.02,
        max_buffer=100,
        max_batch=30,
        registry=registry,
    )
    sink.start()
    try:
        for i in range(150):
            sink.add("ttft", sample_row(i), 10.0 + i)
        assert sink.buffered == 100 and sink.dropped == 50
        await eventually(lambda: sink.stats.failed_flushes >= 3)
        assert sink.held == 100  # a flush may be posting a batch at this moment: held counts it
        for i in range(1000):
            sink.add("tpot", sample_row(i), 5.0)
            if i % 100 == 0:
                await asyncio.sleep(0.01)  # let failing flushes interleave with new samples
        assert sink.buffered <= 100
        assert sink.stats.added == 1150 and sink.stats.sent == 0
        # Every sample is accounted for, whether or not a failing post is in flight right now.
        assert sink.dropped == 1150 - sink.held
        assert sink.held <= 100 + 30
        assert (
            registry.get_sample_value("slorouter_training_sink_samples_total", {"outcome": "dropped"})
            == sink.dropped
        )
    finally:
        await sink.stop(final_flush_timeout_s=0.5)


async def test_sink_delivers_in_bulk_and_retries_after_an_outage(tmp_path: Path) -> None:
    port = free_port()
    sink = TrainingSampleSink(f"http://127.0.0.1:{port}", flush_interval_s=0.02, max_batch=40)
    sink.start()
    training = TrainingServer(tmp_path / "models", trainer_config=FAST_TRAINING)
    try:
        x_ttft, _, x_tpot, _ = synthetic(100, seed=4)
        for i in range(100):
            sink.add("ttft", x_ttft[i], 20.0 + i)  # numpy rows of the model's own columns work too
            sink.add(
                "tpot", dict(zip(RowEncoder().names, [*x_ttft[i].tolist(), x_tpot[i, -1]], strict=True)), 7.5
            )
        await eventually(lambda: sink.stats.failed_flushes >= 2)
        assert sink.buffered == 200
        await training.start(port=port)
        await eventually(lambda: sink.stats.sent == 200)
        assert training.store.count("ttft") == 100 and training.store.count("tpot") == 100
        assert sink.buffered == 0 and sink.dropped == 0
        stored_x, stored_y = training.store.training_arrays("ttft")
        np.testing.assert_array_equal(np.sort(stored_y), np.arange(20.0, 120.0, dtype=np.float32))
        np.testing.assert_array_equal(stored_x[np.argsort(stored_y)], x_ttft)
    finally:
        await sink.stop()
        await training.stop()


async def test_sink_counts_a_batch_in_flight_and_drops_nothing_silently_at_shutdown() -> None:
    """The buffered gauge holds the batch being posted (before, it read 0 while a post hung, as if the
    samples had been delivered); what a hung training server never took is counted as dropped at stop
    (before, the batch of a cancelled post vanished uncounted)."""
    posts = 0

    async def hang(request: web.Request) -> web.Response:
        nonlocal posts
        posts += 1
        await asyncio.sleep(30)
        return web.json_response({}, status=202)

    app = web.Application()
    app.router.add_post("/v1/samples", hang)
    server = await listen(app, "127.0.0.1", 0)
    registry = CollectorRegistry()
    sink = TrainingSampleSink(server.url, flush_interval_s=0.02, max_buffer=100, registry=registry)
    sink.start()
    try:
        for i in range(10):
            sink.add("ttft", sample_row(i), 10.0 + i)
        await eventually(lambda: posts == 1)
        assert sink.buffered == 0  # out of the queue, in the hung post
        assert registry.get_sample_value("slorouter_training_sink_buffered_samples") == 10
        await sink.stop(final_flush_timeout_s=0.2)
        assert sink.stats.sent == 0 and sink.dropped == 10
        dropped = registry.get_sample_value("slorouter_training_sink_samples_total", {"outcome": "dropped"})
        assert dropped == 10
        assert registry.get_sample_value("slorouter_training_sink_buffered_samples") == 0
    finally:
        await sink.stop()
        await server.close()


def test_samples_are_validated_when_added() -> None:
    row = sample_row()
    assert json.loads(encode_sample("ttft", row, 12.5))["features"]["kv_cache_percentage"] == pytest.approx(
        row["kv_cache_percentage"]
    )
    sink = TrainingSampleSink("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="model kind"):
        sink.add("e2e", row, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency_ms"):
        sink.add("ttft", row, 0.0)
    with pytest.raises(ValueError, match="latency_ms"):
        sink.add("ttft", row, float("nan"))
    with pytest.raises(FeatureError, match="kv_cache_percentage"):
        sink.add("ttft", {**row, "kv_cache_percentage": 2.0}, 1.0)
    with pytest.raises(FeatureError, match="num_tokens_generated"):
        sink.add("tpot", {k: v for k, v in row.items() if k != "num_tokens_generated"}, 1.0)
    with pytest.raises(ValueError, match="shape"):
        sink.add("tpot", np.zeros(3), 1.0)
    assert sink.buffered == 0 and sink.stats.added == 0


async def test_sink_drops_a_batch_the_server_refuses() -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "samples[0]: nope"}}, status=400)

    app = web.Application()
    app.router.add_post("/v1/samples", refuse)
    server = await listen(app, "127.0.0.1", 0)
    sink = TrainingSampleSink(server.url, flush_interval_s=10)
    sink.start()
    try:
        sink.add("ttft", sample_row(), 3.0)
        assert await sink.flush() is True
        assert sink.stats.rejected == 1 and sink.buffered == 0
        assert "nope" in (sink.last_error or "")
    finally:
        await sink.stop()
        await server.close()


# -- remote mode end to end ----------------------------------------------------------------------------------


async def test_remote_predictor_end_to_end(tmp_path: Path) -> None:
    training = TrainingServer(tmp_path / "models", trainer_config=FAST_TRAINING)
    await training.start()
    prediction = PredictionServer(make_source(training_server=training.url), poll_interval_s=0.05)
    await prediction.start()
    remote = RemotePredictor(
        PredictionClient([prediction.url], timeout_s=5.0, health_check_interval_s=0.05),
        TrainingSampleSink(training.url, flush_interval_s=0.05),
    )
    assert isinstance(remote, LatencyPredictorBackend) and not remote.synchronous
    remote.start()
    try:
        x_ttft, y_ttft, x_tpot, y_tpot = synthetic(300, seed=8)
        x_all = np.hstack([x_ttft, x_tpot[:, 6:]])
        with pytest.raises(PredictionUnavailable):
            await remote.predict(x_all[:2])
        with pytest.raises(PredictionUnavailable, match="awaited"):
            remote.predict_now(x_all[:2])
        for i in range(300):
            remote.add_sample("ttft", x_ttft[i], float(y_ttft[i]))
            remote.add_sample("tpot", x_tpot[i], float(y_tpot[i]))
        await eventually(lambda: remote.ready)
        await eventually(lambda: all(prediction.predictor.versions.values()))
        ttft, tpot = await remote.predict(x_all[:20])
        assert np.all(ttft > 0) and np.all(tpot > 0)
    finally:
        await remote.stop()
        await prediction.stop()
        await training.stop()


async def test_from_urls_builds_both_halves() -> None:
    remote = RemotePredictor.from_urls(["http://127.0.0.1:1/"], "http://127.0.0.1:2/", timeout_s=0.02)
    assert remote.client.servers[0].url == "http://127.0.0.1:1"
    assert remote.client.timeout_s == 0.02
    assert remote.sink.url == "http://127.0.0.1:2"


async def test_health_probe_marks_servers(client_factory: Callable[..., PredictionClient]) -> None:
    ready = {"value": False}

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({}, status=200 if ready["value"] else 503)

    server = await fake_server(readyz)
    try:
        client = client_factory([server.url], health_check_interval_s=0.02)
        await eventually(lambda: client.servers[0].ready is False)
        ready["value"] = True
        await eventually(lambda: client.ready)
    finally:
        await server.close()


async def test_client_can_share_a_session(servers: list[PredictionServer]) -> None:
    async with aiohttp.ClientSession() as session:
        client = PredictionClient([servers[0].url], session=session, timeout_s=5.0)
        client.start()
        await client.predict(union(2))
        await client.stop()
        assert not session.closed


def test_a_server_serving_a_superseded_model_is_stale_and_passed_over(caplog: pytest.LogCaptureFixture):
    registry = CollectorRegistry()
    client = PredictionClient(["http://a", "http://b"], registry=registry, stale_after_s=30.0)
    now = [0.0]
    client._now = lambda: now[0]  # type: ignore[method-assign]
    published = {"ttft": "v1"}
    client.published_versions = lambda: published
    a, b = client.servers
    for server in (a, b):
        server.ready, server.versions = True, {"ttft": "v1"}

    def step(seconds: float) -> None:
        now[0] += seconds
        client.check_versions()

    step(1.0)
    published["ttft"] = "v2"  # a reloads within the grace, b never does
    step(1.0)
    a.versions = {"ttft": "v2"}
    step(28.0)
    assert not a.stale and not b.stale  # v1 was published 29 s ago
    step(2.0)
    assert b.stale and not a.stale
    assert "prediction server http://b serves models {'ttft': 'v1'}, superseded" in caplog.text
    assert registry.get_sample_value("slorouter_prediction_server_stale", {"server": "http://b"}) == 1.0
    b.outstanding, a.outstanding = 0, 5
    assert client._pick(set()) is a  # a current server first, however busy
    a.ready = False
    assert client._pick(set()) is b  # the stale one still answers when no current one is ready
    b.versions = {"ttft": "v2"}
    step(1.0)
    assert not b.stale
    assert registry.get_sample_value("slorouter_prediction_server_stale", {"server": "http://b"}) == 0.0


def test_a_version_never_seen_published_counts_from_when_it_was_first_seen_served():
    client = PredictionClient(["http://a"], stale_after_s=10.0)
    now = [100.0]
    client._now = lambda: now[0]  # type: ignore[method-assign]
    client.published_versions = lambda: {"ttft": "v9"}
    server = client.servers[0]
    server.ready, server.versions = True, {"ttft": "v3"}
    client.check_versions()
    now[0] += 9.0
    client.check_versions()
    assert not server.stale
    now[0] += 1.0
    client.check_versions()
    assert server.stale


def test_a_server_that_keeps_up_with_a_fast_trainer_is_never_stale():
    # The trainer publishes faster than the client checks: the server is a version behind at every check,
    # on versions the client never saw published, but none of them is stale_after_s old.
    client = PredictionClient(["http://a"], stale_after_s=10.0)
    now = [0.0]
    client._now = lambda: now[0]  # type: ignore[method-assign]
    published = {"ttft": "v0"}
    client.published_versions = lambda: published
    server = client.servers[0]
    server.ready = True
    for i in range(1, 60):
        published["ttft"] = f"v{2 * i}"
        server.versions = {"ttft": f"v{2 * i - 1}"}
        now[0] += 1.0
        client.check_versions()
        assert not server.stale, i
    assert len(client._current_at) <= 2  # what is neither published nor served is forgotten


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(st.one_of(st.binary(max_size=200), st.builds(lambda o: json.dumps(o).encode(), JSON_VALUES)))
def test_version_answers_of_any_shape_give_a_mapping_of_strings(payload: bytes):
    for parsed in (model_versions_in(payload) or {}, published_versions_in(payload, {"ttft": "before"})):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in parsed.items())
    ready = b'{"status": "ready", "model_versions": {"ttft": "v1", "tpot": 3}}'
    assert model_versions_in(ready) == {"ttft": "v1"}
    assert published_versions_in(b"not json", {"ttft": "before"}) == {"ttft": "before"}


async def test_the_sink_asks_a_retrain_with_its_next_batch_once(tmp_path: Path) -> None:
    training = TrainingServer(tmp_path / "models", trainer_config=FAST_TRAINING)
    await training.start(port=0)
    asked: list[str] = []
    training.trainer.expedite = asked.append  # type: ignore[method-assign]
    sink = TrainingSampleSink(training.url, flush_interval_s=0.02)
    sink.start()
    try:
        x_ttft, _, _, _ = synthetic(10, seed=5)
        sink.request_retrain("ttft")
        for i in range(5):
            sink.add("ttft", x_ttft[i], 10.0 + i)
        await eventually(lambda: sink.stats.sent == 5)
        for i in range(5, 10):
            sink.add("ttft", x_ttft[i], 10.0 + i)
        await eventually(lambda: sink.stats.sent == 10)
        assert asked == ["ttft"]  # asked with the first batch only
    finally:
        await sink.stop()
        await training.stop()
