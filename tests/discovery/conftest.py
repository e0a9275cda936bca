"""A fake API server per test, a kubeconfig pointing at it, and a bounded wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from slorouter.pool.config import KubernetesPoolConfig
from tests.helpers.kube_apiserver import FakeKubeApiServer


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeKubeApiServer]:
    server = FakeKubeApiServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def kubeconfig(apiserver: FakeKubeApiServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(apiserver.kubeconfig())
    return path


def discovery_config(kubeconfig: Path, **fields: Any) -> KubernetesPoolConfig:
    """Short pauses, so that recovery is quick in tests."""
    defaults: dict[str, Any] = {
        "namespace": "default",
        "kubeconfig": str(kubeconfig),
        "backoff_initial_ms": 20,
        "backoff_max_ms": 200,
        "initial_sync_timeout_s": 5,
        "request_timeout_s": 5,
    }
    return KubernetesPoolConfig.model_validate(defaults | fields)


async def eventually(check: Callable[[], object], timeout_s: float = 5.0, what: str = "") -> None:
    """Wait until ``check()`` is truthy; fail with ``what`` (and the last value) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    value = check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what} (last: {value!r})")
        await asyncio.sleep(0.01)
        value = check()
