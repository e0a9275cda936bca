"""helm (put in .cache/helm by deploy/fetch-helm.sh, which `make test` runs) and rendering the chart."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "slorouter"
CRD = ROOT / "deploy" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
RELEASE, NAMESPACE = "llama", "inference"
Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = Path(os.environ.get("SLOROUTER_HELM", ROOT / ".cache" / "helm" / "helm"))
    if not binary.is_file():
        message = f"no helm at {binary}: `make test` fetches it (deploy/fetch-helm.sh)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must have run the set-up: a missing helm is a failure there
        pytest.skip(message)
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(binary), *args], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result

    return run


def set_flags(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="session")
def render(helm: Callable[..., subprocess.CompletedProcess[str]]) -> Render:
    def run(values: dict[str, str] | None = None, *files: Path) -> list[dict[str, Any]]:
        options = [arg for path in files for arg in ("--values", str(path))] + set_flags(values or {})
        out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *options)
        return [doc for doc in yaml.safe_load_all(out.stdout) if doc]

    return run


def one(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} manifests"
    return found[0]
