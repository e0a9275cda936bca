"""``slorouter predictor training-server|prediction-server``: flags, and both servers as processes."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from slorouter.predictor import command
from slorouter.predictor.state_dir import StateDirLock
from slorouter.predictor.training_server import TrainingServer
from tests.helpers.predictor_models import (
    FAST_TRAINING,
    eventually,
    feature_rows,
    samples_body,
    samples_request,
    synthetic,
)
from tests.helpers.processes import free_port, wait_for_line


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="slorouter")
    command.register(root.add_subparsers(dest="command"))
    return root


def test_defaults() -> None:
    args = parser().parse_args(["predictor", "training-server", "--model-dir", "/m"])
    assert (args.host, args.port, args.model_dir, args.objective, args.quantile) == (
        "127.0.0.1",
        8000,
        "/m",
        "conformal",
        0.9,
    )
    assert (args.retrain_interval_s, args.min_samples, args.samples_per_bucket) == (5.0, 200, 500)
    assert args.func is command.run_training_server
    args = parser().parse_args(["predictor", "training-server"])  # models and samples in the state dir
    assert (args.state_dir, args.model_dir, args.save_interval_s) == (None, None, 60.0)
    assert args.max_state_age_s == 86_400.0  # a day
    args = parser().parse_args(["predictor", "prediction-server", "--training-server", "http://h:8000/"])
    assert (args.host, args.port, args.training_server, args.model_dir, args.poll_interval_s) == (
        "127.0.0.1",
        8001,
        "http://h:8000",
        None,
        1.0,
    )
    assert args.enable_fault_injection is False  # a production server exposes no /admin/faults
    argv = ["predictor", "prediction-server", "--model-dir", "/m", "--enable-fault-injection"]
    assert parser().parse_args(argv).enable_fault_injection is True
    assert args.func is command.run_prediction_server


@pytest.mark.parametrize(
    "argv",
    [
        ["training-server", "--save-interval-s", "0"],
        ["training-server", "--max-state-age-s", "-1"],
        ["training-server", "--model-dir", "m", "--port", "70000"],
        ["training-server", "--model-dir", "m", "--quantile", "1.5"],
        ["training-server", "--model-dir", "m", "--quantile", "nan"],
        ["training-server", "--model-dir", "m", "--objective", "median"],
        ["training-server", "--model-dir", "m", "--min-samples", "0"],
        ["training-server", "--model-dir", "m", "--retrain-interval-s", "-1"],
        ["training-server", "--model-dir", "m", "--kv-buckets", "many"],
        ["prediction-server"],  # one source is required
        ["prediction-server", "--model-dir", "m", "--training-server", "http://h"],
        ["prediction-server", "--training-server", "h:8000"],
        ["prediction-server", "--model-dir", "m", "--poll-interval-s", "0"],
        ["prediction-server", "--model-dir", "m", "--max-rows", "-5"],
        ["elsewhere"],
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["predictor", *argv])
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_predictor_without_a_server_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["predictor"])
    assert args.func(args) == 2
    assert "training-server" in capsys.readouterr().err


def test_listen_failure_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOROUTER_PREDICTOR_TOKEN", "t")  # a non-loopback address needs one
    args = parser().parse_args(
        [
            "predictor",
            "prediction-server",
            "--model-dir",
            str(tmp_path),
            "--host",
            "203.0.113.1",
            "--port",
            "1",
        ]
    )
    assert args.func(args) == 1
    assert "cannot listen" in capsys.readouterr().err


def test_a_busy_state_directory_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = StateDirLock(tmp_path / "state")
    try:
        args = parser().parse_args(["predictor", "training-server", "--state-dir", str(tmp_path / "state")])
        assert args.func(args) == 2
    finally:
        lock.release()
    assert "--state-dir: state directory" in capsys.readouterr().err
    assert (tmp_path / "state" / "models").is_dir()  # the default model directory


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def _post(url: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def _spawn(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "slorouter.predictor.command", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(process: subprocess.Popen[str]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


@pytest.mark.processes
def test_both_servers_as_separate_processes(tmp_path: Path) -> None:
    training_port, prediction_port = free_port(), free_port()
    training_url = f"http://127.0.0.1:{training_port}"
    prediction_url = f"http://127.0.0.1:{prediction_port}"
    training = _spawn(
        "training-server",
        "--port",
        str(training_port),
        "--model-dir",
        str(tmp_path / "models"),
        "--min-samples",
        "200",
        "--retrain-interval-s",
        "0.1",
        "--train-threads",
        "1",
        "--log-level",
        "WARNING",
    )
    prediction = _spawn(
        "prediction-server",
        "--port",
        str(prediction_port),
        "--training-server",
        training_url,
        "--poll-interval-s",
        "0.1",
        "--log-level",
        "ERROR",
    )
    try:
        _wait(lambda: _get(training_url + "/readyz")[0] == 200)
        _wait(lambda: _get(prediction_url + "/healthz")[0] == 200)
        assert _get(prediction_url + "/readyz")[0] == 503
        status, body = _post(training_url + "/v1/samples", samples_request(samples_body(300)))
        assert (status, body) == (202, {"accepted": 600, "model_versions": {}})
        _wait(lambda: _get(prediction_url + "/readyz")[0] == 200)
        rows = feature_rows(*synthetic(3, seed=4)[::2])
        _wait(
            lambda: len(_post(prediction_url + "/v1/predict/bulk", {"rows": rows})[1]["model_versions"]) == 2
        )
        status, body = _post(prediction_url + "/v1/predict/bulk", {"rows": rows})
        assert status == 200 and len(body["predictions"]) == 3
        assert all(p["ttft_ms"] > 0 and p["tpot_ms"] > 0 for p in body["predictions"])
    finally:
        codes = (_stop(prediction), _stop(training))
    assert codes == (0, 0), (
        prediction.stderr.read() if prediction.stderr else "",
        training.stderr.read() if training.stderr else "",
    )
    assert "listening on" in (training.stdout.read() if training.stdout else "")


def test_registered_in_the_main_cli() -> None:
    from slorouter import cli

    if "slorouter.predictor.command" not in cli.SUBCOMMAND_MODULES:
        pytest.skip("the predictor subcommand is not registered in slorouter.cli yet")
    args = cli.build_parser().parse_args(["predictor", "prediction-server", "--model-dir", "m"])
    assert args.func is command.run_prediction_server


def _spawn_listening(*argv: str) -> tuple[subprocess.Popen[str], float]:
    """A server process, and the monotonic time at which it said it was listening."""
    process = _spawn(*argv)
    _, at = wait_for_line(process, "listening on")
    return process, at


@pytest.mark.processes
async def test_restarted_servers_serve_the_saved_models_at_once(tmp_path: Path) -> None:
    # The previous run (in-process, to keep the test short): trained on samples of one pool, then stopped.
    shape = {"kv_caches": [{"block_size": 16, "num_gpu_blocks": 29205}]}
    previous = TrainingServer(
        tmp_path / "state" / "models", state_dir=tmp_path / "state", trainer_config=FAST_TRAINING
    )
    await previous.start()
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            previous.url + "/v1/samples", json=samples_request(samples_body(300), pool_shape=shape)
        ) as r,
    ):
        assert r.status == 202
    await eventually(lambda: all(previous.trainer.current_version(kind) for kind in ("ttft", "tpot")))
    await previous.stop()
    versions = {kind: previous.trainer.current_version(kind) for kind in ("ttft", "tpot")}

    training_port, port = free_port(), free_port()
    training_url = f"http://127.0.0.1:{training_port}"
    training, _ = _spawn_listening(
        "training-server",
        "--port",
        str(training_port),
        "--state-dir",
        str(tmp_path / "state"),
        "--log-level",
        "WARNING",
    )
    prediction = None
    try:
        state = _get(training_url + "/v1/status")[1]
        assert state["model_versions"] == versions
        assert state["state"]["warm_start"]["samples"] == {"ttft": 300, "tpot": 300}
        assert state["pool_shape"] == shape
        prediction, listening = _spawn_listening(
            "prediction-server",
            "--port",
            str(port),
            "--training-server",
            training_url,
            "--log-level",
            "WARNING",
        )
        _wait(
            lambda: (
                _get(f"http://127.0.0.1:{port}/readyz")[1] == {"status": "ready", "model_versions": versions}
            )
        )
        assert time.monotonic() - listening < 1.0
        rows = feature_rows(*synthetic(2)[::2])
        status, body = _post(f"http://127.0.0.1:{port}/v1/predict/bulk", {"rows": rows})
        assert status == 200 and body["model_versions"] == versions
    finally:
        codes = [_stop(p) for p in (prediction, training) if p is not None]
    assert codes == [0, 0]
