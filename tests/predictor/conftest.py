from __future__ import annotations

import numpy as np
import pytest

from slorouter.clock import ManualClock
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer, TrainerConfig


def synthetic(
    n: int, seed: int = 0, *, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of both kinds with latencies that depend on the features (plus noise): (X_ttft, y, X_tpot, y)."""
    rng = np.random.default_rng(seed)
    kv = rng.random(n)
    length = rng.integers(1, 4000, n).astype(np.float64)
    waiting = rng.integers(0, 20, n).astype(np.float64)
    running = rng.integers(0, 100, n).astype(np.float64)
    prefill = rng.integers(0, 20000, n).astype(np.float64)
    decode = rng.integers(0, 100000, n).astype(np.float64)
    prefix = rng.random(n)
    out = rng.integers(1, 500, n).astype(np.float64)
    effective = (1 - prefix) * length
    noise = rng.lognormal(0.0, 0.1, n)
    ttft = scale * (10 + 0.02 * effective + 30 * waiting + 0.002 * prefill + 5 * kv) * noise
    tpot = scale * (8 + 0.1 * running + 0.00005 * decode + 4 * kv) * noise
    x_ttft = np.column_stack([kv, length, waiting, running, prefill, decode, prefix, effective]).astype(
        np.float32
    )
    x_tpot = np.column_stack([kv, length, waiting, running, prefill, decode, out]).astype(np.float32)
    return x_ttft, ttft, x_tpot, tpot


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def small_config() -> TrainerConfig:
    """Few trees: these tests check the mechanics, not accuracy."""
    return TrainerConfig(n_estimators=20, min_samples=200, retrain_interval_s=5.0, nthread=1)


@pytest.fixture
def trainer(tmp_path, clock: ManualClock, small_config: TrainerConfig) -> Trainer:  # type: ignore[no-untyped-def]
    return Trainer(SampleStore(), ModelStore(tmp_path / "models"), small_config, clock)
