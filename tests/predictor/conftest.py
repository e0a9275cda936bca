from __future__ import annotations

import pytest

from slorouter.clock import ManualClock
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer, TrainerConfig


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
