"""The Grafana dashboard and the alerting rules against a real Prometheus and promtool.

Prometheus comes from Debian's ``prometheus`` package (2.42, with promtool), which ``make prometheus``
installs (``make test`` runs it; as root); without it these tests are skipped.

The end-to-end test starts two simulated pods (``slorouter sim``, a small KV cache so that sheddable
requests find no cold pod, a few answers 503 or cut mid-stream, KV events of which a few are lost), a
gateway (``slorouter serve``) with the embedded predictor (trained after a few dozen requests) and flow
control on, and a Prometheus on 127.0.0.1 scraping the gateway every second. It sends load (streamed and
not, with SLO headers, some sheddable, some for an unknown model), waits until Prometheus has scraped the
end of it, and evaluates every target of every panel through ``/api/v1/query``: a query Prometheus refuses
fails the test, and so does one without any series, except the targets in ``NEEDS_OTHER_COMPONENTS``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from slorouter.scheduling.pipelines import PREDICTED_LATENCY_SCHEDULER_CONFIG
from tests.helpers.processes import free_port, wait_for_lines

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "slorouter.json"
RULES = ROOT / "deploy" / "prometheus" / "slorouter-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "slorouter-rules.test.yaml"

# Panel targets (panel title, legend) that have no series on a single gateway with the embedded predictor
# under this load, and why.
NEEDS_OTHER_COMPONENTS = {
    ("HTTP limit rejections", "{{limit}}"): "only once a gateway limit turns a client away",
    # The admitter sheds only when no pod is idle at that moment; with the router's queue holding the load,
    # whether that happens depends on the machine's timing.
    ("SLO violations and sheds", "shed {{model_name}}"): "only once a request is shed (every pod busy)",
    ("Upstream failures and retries", "retried"): "only after a connect failure (a pod down)",
    ("Predictor ready", "prediction servers"): "the prediction-server sidecars (predictor.mode: remote)",
    ("Model age", "training server {{model}}"): "the training-server sidecar",
    ("Training rounds", "{{model}} {{outcome}}"): "the training-server sidecar",
    ("Hold-out MAPE", "{{model}}"): "the training-server sidecar",
    ("Hold-out coverage", "{{model}}"): "the training-server sidecar",
    ("Oldest queued request", "{{fairness_id}} {{priority}}"): "listed only while requests are queued",
    ("Prediction drifts", "drifting {{endpoint}} {{kind}}"): "only while an endpoint's predictions drift",
    ("Stale prediction servers", "{{server}}"): "the prediction-server sidecars (predictor.mode: remote)",
}

# Grafana's variables, as a query would see them over a short range.
VARIABLES = {"${datasource}": "prometheus", "$__rate_interval": "1m", "$__interval": "1s", "$job": ".+"}


def prometheus_binaries() -> tuple[str, str]:
    """The prometheus and promtool binaries (``make prometheus`` installs them); the test is skipped without
    them."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.skip("prometheus and promtool are not installed: `make prometheus` installs them (as root)")
    return prometheus, promtool


def panel_targets() -> list[tuple[str, str, str]]:
    """(panel title, legend, expr) of every target of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target.get("legendFormat", ""), target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", ())
    ]


def concrete(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_dashboard_is_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "slorouter" and dashboard["title"] == "slorouter"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            # Counters and histogram series are read through rate() (histograms then histogram_quantile).
            for function in re.findall(r"(\w*\()?\w+_(?:total|bucket|count)\{", target["expr"]):
                assert function == "rate(", (panel["title"], target["expr"])
    assert set(NEEDS_OTHER_COMPONENTS) <= {(title, legend) for title, legend, _ in panel_targets()}


@pytest.mark.processes
def test_rules_check_and_unit_tests() -> None:
    _, promtool = prometheus_binaries()
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        done = subprocess.run(
            [promtool, *args], capture_output=True, text=True, check=False, cwd=RULES.parent
        )
        assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def _streaming_pipeline() -> dict[str, Any]:
    """The shipped predicted-latency pipeline with ``streamingMode: true`` (TTFT and TPOT models), as the
    benchmark's predicted-latency policy runs it."""
    config = copy.deepcopy(PREDICTED_LATENCY_SCHEDULER_CONFIG)
    for plugin in config["plugins"]:
        if plugin["type"] == "predicted-latency-producer":
            plugin["parameters"] = {**plugin.get("parameters", {}), "streamingMode": True}
    return config


def _spawn(args: list[str], log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with log.open("w") as err:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def _poll(what: str, check: Any, timeout_s: float = 60.0, every_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Simulated pods, a gateway with the predictor and flow control, and Prometheus scraping it."""
    prometheus, _ = prometheus_binaries()
    processes: list[subprocess.Popen[str]] = []
    try:
        sim = _spawn(
            [sys.executable, "-m", "slorouter.cli", "sim", "--pods", "2", "--port", "0",
             "--engine-variant", "kv-blocks=2048", "--kv-events-port", "0",
             "--fault", "status,status=503,probability=0.03",
             "--fault", "kill-mid-stream,after_tokens=2,probability=0.03",
             "--fault", "kv-events-drop,replayable=0,probability=0.05"],
            tmp_path / "sim.log",
        )  # fmt: skip
        processes.append(sim)
        lines = wait_for_lines(sim, ["slorouter sim:", "http://", "http://"])
        # "  sim-PORT http://ADDRESS kv-events ENDPOINT replay ENDPOINT": the pods publish KV events, some
        # lost for good, so that the KV index trust panel has endpoints in more than one state.
        fields = [line.split("http://")[1].split() for line, _ in lines[1:]]
        pods = [f[0] for f in fields]
        endpoints = [
            {"address": f[0], "kv_events": {"endpoint": f[2], "replay_endpoint": f[4]}} for f in fields
        ]
        gateway_port = free_port()
        config = {
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "pool": {"endpoints": endpoints},
            "predictor": {
                "mode": "embedded",
                "prediction_by_default": True,
                "embedded": {
                    "persist": False,
                    "min_samples": 20,
                    "retrain_interval_s": 0.5,
                    "n_estimators": 20,
                    "max_depth": 3,
                },
            },
            "scheduler": _streaming_pipeline(),
            "objectives": {
                "batch": {"priority": -1, "deadline": {"action": "cancel"}},
                "interactive": {"priority": 1, "deadline": {"action": "hedge"}},
            },
            "flowControl": {"enabled": True, "saturationDetector": {"maxInflightRequestsPerEndpoint": 2}},
            "audit": {"regret": True},
        }
        (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
        gateway = _spawn(
            [sys.executable, "-m", "slorouter.cli", "serve", "--config", str(tmp_path / "serve.yaml"),
             "--log-level", "WARNING"],
            tmp_path / "serve.log",
        )  # fmt: skip
        processes.append(gateway)
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        _poll("the gateway", lambda: urllib.request.urlopen(f"{gateway_url}/health", timeout=1).status == 200)

        prometheus_port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "slorouter",
                            "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}],
                        }
                    ],
                }
            )
        )
        prom = _spawn(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prometheus_port}",
             "--log.level=warn"],
            tmp_path / "prometheus.log",
        )  # fmt: skip
        processes.append(prom)
        prometheus_url = f"http://127.0.0.1:{prometheus_port}"
        _poll(
            "Prometheus", lambda: urllib.request.urlopen(f"{prometheus_url}/-/ready", timeout=1).status == 200
        )
        yield {
            "gateway": gateway_url,
            "prometheus": prometheus_url,
            "logs": str(tmp_path),
            "pods": ",".join(pods),
        }
    finally:
        for process in reversed(processes):
            _stop(process)


def _request(gateway: str, model: str, i: int) -> int:
    """One request; every fourth streamed, every other one interactive (hedged when slow), every fifth
    sheddable with an SLO no pod meets (shed, or cancelled at its deadline), a few for a model no pod serves.
    Returns the HTTP status."""
    stream = i % 4 == 0
    body: dict[str, Any] = {"model": "unknown-model" if i % 37 == 0 else model, "max_tokens": 4 + i % 12}
    body["prompt"] = f"request {i} " + "lorem ipsum " * (100 + i % 200)
    if stream:
        body["stream"] = True
    headers = {"Content-Type": "application/json", "x-slo-ttft-ms": "400"}
    if i % 2:
        headers["x-gateway-inference-objective"] = "interactive"
    headers["x-slo-tpot-ms"] = "2" if i % 3 == 0 else "50"
    if i % 5 == 0:
        headers.update({"x-gateway-inference-objective": "batch", "x-slo-ttft-ms": "1"})
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{gateway}/v1/completions", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):  # a stream cut mid-way by the pod's fault
        return 0


def _trained(metrics: bytes) -> bool:
    """Both models are trained (the TPOT one learns from streamed requests only)."""
    return all(
        f'slorouter_predictor_model_info{{model="{kind}"'.encode() in metrics for kind in ("ttft", "tpot")
    )


def _metrics_text(gateway: str) -> str:
    text = urllib.request.urlopen(f"{gateway}/metrics").read().decode()
    return "\n".join(line for line in text.splitlines() if "predict" in line or "training" in line)


def _query(prometheus: str, expr: str) -> dict[str, Any]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        return dict(_get_json(url, timeout=30))
    except urllib.error.HTTPError as exc:  # 400: the query does not parse or evaluate
        return dict(json.loads(exc.read()))


def _scalar(prometheus: str, expr: str) -> float:
    result = _query(prometheus, expr)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


@pytest.mark.processes
def test_every_panel_query_has_series_on_a_real_prometheus(stack: dict[str, str]) -> None:
    gateway, prometheus = stack["gateway"], stack["prometheus"]
    model = _get_json(f"{gateway}/v1/models")["data"][0]["id"]
    assert model

    def send(first: int, count: int) -> list[int]:
        def one(i: int) -> int:
            return _request(gateway, model, i)

        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(first, first + count)))

    # Train the predictor (sending more while it learns), then send the rest (predicted routes, sheds).
    statuses = send(0, 120)
    deadline = time.monotonic() + 90
    while not _trained(urllib.request.urlopen(f"{gateway}/metrics").read()):
        assert time.monotonic() < deadline, "the predictor did not train:\n" + _metrics_text(gateway)
        statuses += send(len(statuses), 40)
    statuses += send(len(statuses), 200)
    assert statuses.count(200) > 150, statuses

    # Prometheus has scraped the end of the load: its count of requests matches the gateway's own.
    def caught_up() -> bool:
        scraped = _scalar(prometheus, "sum(slorouter_requests_total)")
        return (
            scraped >= len(statuses) and _scalar(prometheus, 'count_over_time(up{job="slorouter"}[1m])') >= 5
        )

    _poll("Prometheus to scrape the load", caught_up, timeout_s=60)

    failures = []
    for title, legend, expr in panel_targets():
        answer = _query(prometheus, concrete(expr))
        if answer.get("status") != "success":
            failures.append(f"{title} [{legend}]: invalid: {answer.get('error')}\n    {concrete(expr)}")
        elif not answer["data"]["result"] and (title, legend) not in NEEDS_OTHER_COMPONENTS:
            failures.append(f"{title} [{legend}]: no series\n    {concrete(expr)}")
    assert not failures, "\n".join(failures) + f"\n(logs in {stack['logs']})"
