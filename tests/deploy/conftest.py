"""helm (put in .cache/helm by deploy/fetch-helm.sh, which `make test` runs) and rendering the chart with
it; what the tests check a rendering with is in tests/helpers/chart.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.chart import CHART, IMAGE, NAMESPACE, RELEASE, ROOT, Render, set_flags


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


@pytest.fixture(scope="session")
def render(helm: Callable[..., subprocess.CompletedProcess[str]]) -> Render:
    """`helm template` of the chart, with IMAGE and then `values`; namespace None renders as the seed's
    line does, without one."""

    def run(
        values: dict[str, str] | None = None,
        *files: Path,
        release: str = RELEASE,
        namespace: str | None = NAMESPACE,
    ) -> list[dict[str, Any]]:
        options = [arg for path in files for arg in ("--values", str(path))]
        options += set_flags({**IMAGE, **(values or {})})
        if namespace is not None:
            options += ["--namespace", namespace]
        out = helm("template", release, str(CHART), *options)
        return [doc for doc in yaml.safe_load_all(out.stdout) if doc]

    return run
