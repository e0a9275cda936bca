"""``benchmarks/soak.py`` in its CI size: a 2-pod soak with pod kills and a prediction-server restart, and a
1-pod overload, every process real on 127.0.0.1. The assertions are about accounting (every failure was in
flight on a killed pod, in-flight gauges back to 0, /health and /metrics answered throughout), never about
speed; the RSS/fd growth check needs the long run (docs/reliability.md#soak) and is not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "benchmarks" / "soak.py"


def _run(tmp_path: Path, *args: str) -> dict[str, Any]:
    """Runs soak.py (bounded) and returns its JSON result; exit 1 only says a check failed, read below."""
    proc = subprocess.run(
        [sys.executable, str(SOAK), *args, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    name = "overload.json" if "--overload" in args else "soak.json"
    result: dict[str, Any] = json.loads((tmp_path / name).read_text())
    assert (tmp_path / name.replace(".json", ".png")).stat().st_size > 0
    return result


@pytest.mark.timeout(120)
def test_short_soak_accounts_for_every_failure(tmp_path: Path) -> None:
    result = _run(tmp_path, "--short", "--pods", "2", "--warmup", "6", "--duration", "20",
                  "--fault-interval", "6", "--down", "1", "--window", "10")  # fmt: skip
    s = result["summary"]
    pods_killed = {f["target"] for f in result["faults"] if f["kind"] == "pod"}
    assert s["pod_kills"] == 2 and len(pods_killed) == 2  # each pod in turn
    assert s["predictor_restarts"] == 1
    assert all(f["listening"] > f["killed"] for f in result["faults"])  # every one came back
    assert s["sent"] == len(result["outcomes"]) > 0
    assert s["completed"] + s["failed"] == s["sent"]
    # The kills hit requests in flight (70 % of 2 pods' capacity keeps some on each), and only those fail.
    assert s["failed_accounted"] > 0
    assert s["failed_unaccounted"] == 0, result["unaccounted"][:5]
    for row in result["accounted"]:
        assert row["endpoint"] in pods_killed
        assert row["sent"] <= row["killed"] + 0.05 <= row["end"] + 0.1
    assert s["inflight_at_end"] == {"requests": 0.0, "prefill_tokens": 0.0, "decode_tokens": 0.0}
    for path in ("/health", "/metrics"):
        assert s["probes"][path]["probes"] > 0 and s["probes"][path]["failed"] == 0
    assert s["gateway_exit"] == 0
    assert not any("Traceback" in line for lines in s["log_problems"].values() for line in lines)


@pytest.mark.timeout(120)
def test_short_overload_answers_health_and_sheds_as_configured(tmp_path: Path) -> None:
    result = _run(tmp_path, "--overload", "--short", "--pods", "1", "--baseline", "5", "--overload-s", "8",
                  "--recovery", "10", "--max-concurrent", "12", "--window", "5")  # fmt: skip
    s = result["summary"]
    for name, phase in s["phases"].items():
        for path in ("/health", "/metrics"):
            assert phase["probes"][path]["probes"] > 0, (name, path)
            assert phase["probes"][path]["failed"] == 0, (name, path, phase["probes"][path])
    # Twice one pod's capacity against a bound of 12 requests at once: the excess gets 503, no other error.
    overload = s["phases"]["overload"]["statuses"]
    assert overload.get("503", 0) + overload.get("503-sheddable", 0) > 0, overload
    assert s["unexpected_errors"] == 0, result["unexpected"][:5]
    assert s["phases"]["recovery"]["ok"] > 0
    assert s["inflight_at_end"] == {"requests": 0.0, "prefill_tokens": 0.0, "decode_tokens": 0.0}
    assert s["gateway_exit"] == 0
