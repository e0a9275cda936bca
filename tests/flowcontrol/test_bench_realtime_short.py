"""``benchmarks/bench_flow_control_realtime.py`` in a short size: a few seconds of base load, a burst and base
load again, through the gateway and Envoy + `slorouter epp` with flow control, every process real on
127.0.0.1. The assertions are about accounting (every request answered 200, 429 or 503 and nothing else,
the in-flight and queue gauges back to 0 once the load drained, the script's exit status), never about
speed: the machine's other load decides the latencies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slorouter.extproc.envoy import envoy_binary

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_flow_control_realtime.py"


@pytest.mark.timeout(170)
def test_short_burst_answers_every_request_and_drains_the_gauges(tmp_path: Path) -> None:
    front_ends = "gateway,epp" if envoy_binary() is not None else "gateway"
    out = tmp_path / "results.json"
    # The lane's default, spelled out in a file: the runs with flow control use the section given.
    flow_control = tmp_path / "fc.yaml"
    flow_control.write_text("flowControl: {priorityLane: {minPriority: 1}}\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--seeds", "0", "--front-ends", front_ends, "--flow-control", "on",
         "--flow-control-config", str(flow_control),
         "--base-seconds", "2", "--burst-seconds", "3", "--after-seconds", "2", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=160,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["args"]["flow_control_section"] == {"enabled": True, "priorityLane": {"minPriority": 1}}
    assert sorted(result["outputs"]) == sorted(f"{f} on" for f in front_ends.split(","))
    for config, (output,) in result["outputs"].items():
        rows = output["results"]
        assert {r["phase"] for r in rows} == {"base", "burst", "after"}, config
        assert {r["cls"] for r in rows} == {"critical", "standard", "sheddable"}, config
        assert {r["status"] for r in rows} <= {200, 429, 503}, config
        # Flow control is on: every request that went through carries the time it was held.
        assert all(r["queued_ms"] >= 0 for r in rows if r["status"] == 200), config
        gauges = output["info"]["gauges"]
        assert gauges["zero"], (config, gauges)
        assert gauges["slorouter_flow_control_queue_size"] == 0, (config, gauges)
        summary = result["summaries"][config][0]["whole run"]["all"]
        assert summary["error"] == 0 and summary["requests"] == len(rows) > 0, (config, summary)


def test_a_flow_control_config_with_a_bad_key_is_refused_by_name(tmp_path: Path) -> None:
    config = tmp_path / "fc.yaml"
    config.write_text("priorityLane: {minPriority: high}\n")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--flow-control-config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--flow-control-config" in proc.stderr and "flowControl.priorityLane.minPriority" in proc.stderr
