"""Predictor models for tests: synthetic samples with a learnable relation, trained models on disk, sample
bodies for the training server, and the fixtures of the server, client and embedded tests (a module binds
one with ``trained_dir = predictor_models.trained_dir``)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from slorouter.predictor.features import DEFAULT_SCHEMA, MODEL_KINDS
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.pool_shape import PoolShape
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer, TrainerConfig
from slorouter.predictor.wire import RowEncoder


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


def matrices(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x_ttft, _, x_tpot, _ = synthetic(n, seed)
    return x_ttft, x_tpot


def union(n: int, seed: int = 0) -> np.ndarray:
    """Rows of both models' features (``all_features()`` order: the TTFT columns, then the TPOT output)."""
    x_ttft, x_tpot = matrices(n, seed)
    return np.hstack([x_ttft, x_tpot[:, 6:]])


# Few trees and a short cadence: these tests check the mechanics, not accuracy.
FAST_TRAINING = TrainerConfig(
    n_estimators=20, max_depth=4, min_samples=200, retrain_interval_s=0.05, nthread=1
)
# The same, training as soon as there are samples enough (the warm-start tests).
TRAINING = replace(FAST_TRAINING, retrain_interval_s=0.0)
# A pool of H100 pods (the warm-start tests' shape).
H100 = PoolShape(((16, 29_205),))


def feature_rows(x_ttft: np.ndarray, x_tpot: np.ndarray) -> list[dict[str, float]]:
    """Rows carrying the union of both feature sets, keyed by name (as the HTTP contract sends them)."""
    names = RowEncoder().names
    wire = np.hstack([x_ttft, x_tpot[:, -1:]])
    return [dict(zip(names, row, strict=True)) for row in wire.astype(np.float64).tolist()]


SAMPLES_SCHEMA = DEFAULT_SCHEMA.key()  # the "schema" member of POST /v1/samples


def samples_request(samples: list[dict[str, Any]], **members: Any) -> dict[str, Any]:
    """A ``POST /v1/samples`` body for this schema."""
    return {"schema": SAMPLES_SCHEMA, "samples": samples, **members}


def samples_body(n: int, seed: int = 0, *, scale: float = 1.0) -> list[dict[str, Any]]:
    """``n`` TTFT and ``n`` TPOT samples for ``POST /v1/samples`` with a learnable relation (latencies
    × ``scale``)."""
    x_ttft, y_ttft, x_tpot, y_tpot = synthetic(n, seed, scale=scale)
    rows = feature_rows(x_ttft, x_tpot)
    samples = [
        {"model": "ttft", "features": row, "latency_ms": float(y)}
        for row, y in zip(rows, y_ttft, strict=True)
    ]
    samples += [
        {"model": "tpot", "features": dict(row), "latency_ms": float(y)}
        for row, y in zip(rows, y_tpot, strict=True)
    ]
    return samples


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 30.0) -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` seconds (a bound, not a speed claim)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def train_models(directory: Path, n: int = 400, seed: int = 0) -> Path:
    """Train both models (small, fast) into ``directory`` with the library's trainer."""
    store = SampleStore()
    x_ttft, y_ttft, x_tpot, y_tpot = synthetic(n, seed)
    store.add("ttft", x_ttft, y_ttft)
    store.add("tpot", x_tpot, y_tpot)
    trainer = Trainer(store, ModelStore(directory), replace(FAST_TRAINING, retrain_interval_s=0.0))
    for kind in MODEL_KINDS:
        report = trainer.train(kind)
        assert report is not None and report.accepted
    return directory


def copy_models(source: Path, destination: Path, kinds: tuple[str, ...] = MODEL_KINDS) -> Path:
    """Copy the current models of ``kinds`` into another model directory (a new, writable one)."""
    destination.mkdir(parents=True, exist_ok=True)
    src, dst = ModelStore(source), ModelStore(destination)
    for kind in kinds:
        loaded = src.load(kind)  # type: ignore[arg-type]
        assert loaded is not None
        dst.save(kind, *loaded)  # type: ignore[arg-type]
    return destination


def republish(directory: Path, suffix: str, kinds: tuple[str, ...] = MODEL_KINDS) -> dict[str, str]:
    """Publish the current models again under new versions (as a new training would)."""
    store = ModelStore(directory)
    versions = {}
    for kind in kinds:
        loaded = store.load(kind)  # type: ignore[arg-type]
        assert loaded is not None
        raw, metadata = loaded
        versions[kind] = store.save(kind, raw, replace(metadata, version=f"{metadata.version}-{suffix}"))  # type: ignore[arg-type]
    return versions


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory with trained TTFT and TPOT models; read-only (copy it to change it)."""
    return train_models(tmp_path_factory.mktemp("trained-models"))


@pytest.fixture
def model_dir(trained_dir: Path, tmp_path: Path) -> Path:
    """A writable copy of ``trained_dir``."""
    destination = tmp_path / "models"
    shutil.copytree(trained_dir, destination)
    return destination


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session
