"""Builders for scheduling tests: pools with set signals, requests, plugin contexts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling.plugin import PluginContext
from slorouter.scheduling.types import Candidates, InferenceRequest


def addresses(n: int) -> list[str]:
    return [f"10.0.0.{i + 1}:8000" for i in range(n)]


def make_pool(n: int, **metrics: list[Any]) -> PoolState:
    """A pool of ``n`` endpoints; keyword lists give one MetricsSnapshot field per endpoint."""
    pool = PoolState([Endpoint(a) for a in addresses(n)])
    for i, address in enumerate(addresses(n)):
        snapshot = MetricsSnapshot(**{field: values[i] for field, values in metrics.items()})
        pool.set_metrics(address, snapshot, at=0.0)
    return pool


def candidates_of(pool: PoolState) -> Candidates:
    return Candidates.healthy(pool)


def make_request(prompt: str = "", model: str = "m", **fields: Any) -> InferenceRequest:
    return InferenceRequest(
        request_id=fields.pop("request_id", "r"),
        model=model,
        prompt_text=prompt,
        prompt_tokens=fields.pop("prompt_tokens", len(prompt) // 4),
        max_tokens=fields.pop("max_tokens", 16),
        **fields,
    )


def make_ctx(seed: int = 0, pool: PoolState | None = None) -> PluginContext:
    return PluginContext(rng=np.random.default_rng(seed), pool=pool)


@pytest.fixture
def ctx() -> PluginContext:
    return make_ctx()
