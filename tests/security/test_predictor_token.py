"""The predictor servers' token: no non-loopback bind without one; with one, every endpoint but the probes
needs it (401 with an OpenAI-style body otherwise), and the router's clients and the prediction server's
model source send it. Real servers on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from slorouter.config import ConfigError, parse_config
from slorouter.http.auth import InsecureBindError, is_loopback
from slorouter.predictor.backend import PredictionUnavailable
from slorouter.predictor.model_sources import make_source
from slorouter.predictor.prediction_client import PredictionClient
from slorouter.predictor.prediction_server import PredictionServer
from slorouter.predictor.remote import RemotePredictor
from slorouter.predictor.sample_sink import TrainingSampleSink
from slorouter.predictor.training_server import TrainingServer
from tests.helpers import predictor_models as common
from tests.helpers.predictor_models import FAST_TRAINING, eventually, synthetic

TOKEN = "tok-Zr81-predictor-secret"
trained_dir = common.trained_dir
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.5.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.3", False), ("pod.example", False)],
)  # fmt: skip
def test_loopback_addresses(host: str, loopback: bool):
    assert is_loopback(host) is loopback


async def test_servers_refuse_a_non_loopback_bind_without_a_token(tmp_path: Path):
    # Refused before any socket is opened.
    with pytest.raises(InsecureBindError, match="without a token"):
        await TrainingServer(tmp_path / "models").start("0.0.0.0")
    server = PredictionServer(make_source(model_dir=str(tmp_path / "models")))
    with pytest.raises(InsecureBindError, match="without a token"):
        await server.start("0.0.0.0")
    await server.stop()


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slorouter.cli", "predictor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": SRC, **(env or {})},
    )


@pytest.mark.processes
@pytest.mark.parametrize("server", ["training-server", "prediction-server"])
def test_the_command_exits_2_on_a_non_loopback_bind_without_a_token(tmp_path: Path, server: str):
    extra = ["--state-dir", str(tmp_path / "state")] if server == "training-server" else []
    done = _run(server, "--host", "0.0.0.0", "--port", "0", "--model-dir", str(tmp_path), *extra)
    assert done.returncode == 2, done.stderr
    assert "not a loopback address" in done.stderr and "--token-file" in done.stderr


@pytest.mark.processes
def test_the_command_refuses_an_empty_token_file(tmp_path: Path):
    (tmp_path / "token").write_text("# nothing\n")
    done = _run("prediction-server", "--model-dir", str(tmp_path), "--token-file", str(tmp_path / "token"))
    assert done.returncode == 2
    assert "--token-file" in done.stderr and "holds no token" in done.stderr


@pytest.mark.processes
def test_an_empty_token_variable_is_refused(tmp_path: Path):
    done = _run("prediction-server", "--model-dir", str(tmp_path), env={"SLOROUTER_PREDICTOR_TOKEN": " "})
    assert done.returncode == 2
    assert "SLOROUTER_PREDICTOR_TOKEN" in done.stderr


async def _status(http: aiohttp.ClientSession, method: str, url: str, token: str | None, **kw) -> int:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with http.request(method, url, headers=headers, **kw) as resp:
        if resp.status == 401:
            body = await resp.json()
            assert body["error"]["type"] == "AuthenticationError", body
            assert resp.headers["WWW-Authenticate"] == "Bearer"
        return resp.status


async def test_with_a_token_every_endpoint_but_the_probes_needs_it(tmp_path: Path):
    training = TrainingServer(tmp_path / "models", trainer_config=FAST_TRAINING, tokens=[TOKEN])
    await training.start()
    prediction = PredictionServer(
        make_source(training_server=training.url, tokens=[TOKEN]), poll_interval_s=0.05, tokens=[TOKEN]
    )
    await prediction.start()
    try:
        async with aiohttp.ClientSession() as http:
            guarded = [
                ("POST", training.url + "/v1/samples"),
                ("GET", training.url + "/v1/models/ttft"),
                ("GET", training.url + "/v1/models/ttft/metadata"),
                ("GET", training.url + "/v1/status"),
                ("GET", training.url + "/metrics"),
                ("GET", training.url + "/no-such-path"),
                ("POST", prediction.url + "/v1/predict/bulk"),
                ("POST", prediction.url + "/v1/predict"),
                ("GET", prediction.url + "/v1/status"),
                ("GET", prediction.url + "/metrics"),
            ]
            for method, url in guarded:
                for token in (None, "wrong", TOKEN[:-1]):
                    assert await _status(http, method, url, token, data=b"{}") == 401, (method, url, token)
            assert await _status(http, "GET", training.url + "/v1/status", TOKEN) == 200
            assert await _status(http, "GET", prediction.url + "/v1/status", TOKEN) == 200
            assert await _status(http, "GET", prediction.url + "/metrics", TOKEN) == 200
            for server in (training, prediction):
                assert await _status(http, "GET", server.url + "/healthz", None) == 200
                assert await _status(http, "GET", server.url + "/readyz", None) in (200, 503)
    finally:
        await prediction.stop()
        await training.stop()


async def test_the_router_clients_and_the_model_source_send_the_token(tmp_path: Path):
    training = TrainingServer(tmp_path / "models", trainer_config=FAST_TRAINING, tokens=["new", TOKEN])
    await training.start()
    # Polls models from the training server, with the token.
    prediction = PredictionServer(
        make_source(training_server=training.url, tokens=[TOKEN]), poll_interval_s=0.05, tokens=[TOKEN]
    )
    await prediction.start()
    remote = RemotePredictor(
        PredictionClient([prediction.url], timeout_s=5.0, health_check_interval_s=0.05, tokens=[TOKEN]),
        TrainingSampleSink(training.url, flush_interval_s=0.05, tokens=[TOKEN]),
    )
    tokenless = TrainingSampleSink(training.url, flush_interval_s=10)
    remote.start()
    tokenless.start()
    try:
        x_ttft, y_ttft, x_tpot, y_tpot = synthetic(300, seed=8)
        for i in range(300):
            remote.add_sample("ttft", x_ttft[i], float(y_ttft[i]))
            remote.add_sample("tpot", x_tpot[i], float(y_tpot[i]))
        await eventually(lambda: remote.ready)  # the /readyz probe, models pulled through the token
        await eventually(
            lambda: len(prediction.predictor.versions) == 2 and all(prediction.predictor.versions.values())
        )
        ttft, tpot = await remote.predict(np.hstack([x_ttft, x_tpot[:, 6:]])[:5])
        assert np.all(ttft > 0) and np.all(tpot > 0)
        assert remote.sink.stats.sent == 600
        tokenless.add("ttft", x_ttft[0], 5.0)
        assert await tokenless.flush() is False
        assert "HTTP 401" in (tokenless.last_error or "")
        assert TOKEN not in repr(remote.sink)
    finally:
        await remote.stop()
        await tokenless.stop(final_flush_timeout_s=0.1)
        await prediction.stop()
        await training.stop()


async def test_a_client_without_the_token_gets_no_prediction(
    trained_dir: Path, caplog: pytest.LogCaptureFixture
):
    prediction = PredictionServer(
        make_source(model_dir=str(trained_dir)), poll_interval_s=0.05, tokens=[TOKEN]
    )
    await prediction.start()
    client = PredictionClient([prediction.url], timeout_s=2.0, health_check_interval_s=0.05)
    client.start()
    try:
        await eventually(lambda: client.ready)  # /readyz is open
        x_ttft, _, x_tpot, _ = synthetic(2, seed=3)
        rows = np.hstack([x_ttft, x_tpot[:, 6:]])
        with caplog.at_level(logging.WARNING, "slorouter.predictor.prediction_client"):
            with pytest.raises(PredictionUnavailable, match="HTTP 401") as refused:
                await client.predict(rows)
            assert refused.value.reason == "unauthorized"
            await eventually(lambda: client.ready)
            with pytest.raises(PredictionUnavailable, match="HTTP 401"):
                await client.predict(rows)
        warnings = [r.getMessage() for r in caplog.records if "refused this router's token" in r.getMessage()]
        assert len(warnings) == 1 and "token_file" in warnings[0] and TOKEN not in warnings[0]
    finally:
        await client.stop()
        await prediction.stop()


def test_remote_config_reads_the_token_and_never_shows_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "token").write_text(f"# the sidecars' token\n{TOKEN}\n")
    remote = {"training_server": "http://127.0.0.1:8000", "prediction_servers": ["http://127.0.0.1:8001"]}
    config = parse_config(
        {"predictor": {"mode": "remote", "remote": {**remote, "token_file": str(tmp_path / "token")}}}
    )
    assert config.predictor is not None and config.predictor.remote is not None
    assert config.predictor.remote.tokens == (TOKEN,)
    assert TOKEN not in repr(config) + config.model_dump_json()
    monkeypatch.setenv("TEST_PREDICTOR_TOKEN", TOKEN)
    config = parse_config(
        {"predictor": {"mode": "remote", "remote": {**remote, "token_env": "TEST_PREDICTOR_TOKEN"}}}
    )
    assert config.predictor is not None and config.predictor.remote is not None
    assert config.predictor.remote.tokens == (TOKEN,)
    with pytest.raises(ConfigError, match=r"predictor\.remote: token_file: cannot read"):
        parse_config(
            {"predictor": {"mode": "remote", "remote": {**remote, "token_file": str(tmp_path / "none")}}}
        )
    with pytest.raises(ConfigError, match="not both"):
        parse_config(
            {"predictor": {"mode": "remote", "remote": {**remote, "token_file": "x", "token_env": "Y"}}}
        )
