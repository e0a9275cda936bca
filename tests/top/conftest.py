"""A real router for ``slorouter top`` to watch: ``slorouter sim`` (two pods) behind ``slorouter serve``
with an embedded predictor that trains within seconds, both as subprocesses; requests with an SLO have
been sent through it and its predictor is ready, so every part of the view has something to show."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from slorouter.serving.status import STATUS_PATH, decode_status
from tests.helpers.processes import CLI, free_port, stop, wait_for_lines, wait_listening

MODEL = "sim-llama3-8b"


def complete(address: str, prompt: str) -> None:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://{address}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", "x-slo-ttft-ms": "60000"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        response.read()


@dataclass
class WatchedRouter:
    address: str  # the gateway's host:port
    pods: list[str]  # the simulated pods' host:port


@pytest.fixture(scope="package")
def watched_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchedRouter]:
    sim = subprocess.Popen(
        [*CLI, "sim", "--pods", "2", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    serve = None
    try:
        pods = [line.split("http://", 1)[1].strip() for line, _ in wait_for_lines(sim, ["http://"] * 2)]
        port = free_port()
        config = {
            "gateway": {"host": "127.0.0.1", "port": port},
            "pool": {"endpoints": pods, "scrape_interval_ms": 50},
            "predictor": {
                "mode": "embedded",
                "prediction_by_default": True,
                "embedded": {
                    "persist": False,
                    "min_samples": 20,
                    "retrain_interval_s": 0.2,
                    "n_estimators": 20,
                    "max_depth": 4,
                },
            },
            "seed": 3,
        }
        path = tmp_path_factory.mktemp("top") / "serve.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        serve = subprocess.Popen(
            [*CLI, "serve", "--config", str(path), "--log-level", "WARNING"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        address = f"127.0.0.1:{port}"
        wait_listening(port, serve)
        # Enough finished requests for the first model, then more that are routed by its predictions.
        deadline = time.monotonic() + 60
        sent = 0
        while not _predictor_ready(address):
            assert time.monotonic() < deadline, "the embedded predictor did not train in time"
            complete(address, f"warm-up request {sent}: tell me about the weather")
            sent += 1
        for i in range(12):
            complete(address, f"routed request {i}: " + "and so on " * (i * 20))
        yield WatchedRouter(address, pods)
    finally:
        if serve is not None:
            stop(serve)
        stop(sim)


def _predictor_ready(address: str) -> bool:
    with urllib.request.urlopen(f"http://{address}{STATUS_PATH}", timeout=5) as response:
        return decode_status(response.read()).predictor.ready
