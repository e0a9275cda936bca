"""Loading a trained model: what the predictor does with each new model (after every training round).

Models: TTFT and TPOT, 200 trees, depth 6 (the trainer's defaults), trained on simulator samples. Timed in
turn (median ms of ``--repeats`` calls after a warm-up), for each model:

- ``xgb.Booster.load_model`` of the stored UBJSON bytes: XGBoost's own loading;
- reading the trees for the compiler: XGBoost's JSON (``save_raw("json")``) parsed with orjson;
- ``pack_booster`` (that reading, then packing the trees) and ``CompiledForest.from_booster`` (packing,
  building the tables, and the self-check against XGBoost);
- and, for both models at once, ``Predictor.refresh`` of a fresh predictor (load, compile, combine): the
  reload after a training round.

The compiler once read the stored UBJSON bytes with a reader of its own; this script's version in commit
0486fa3 compares both readings (docs/design/ubjson-reader.md).

    .venv/bin/python benchmarks/bench_model_load.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import timeit
from collections.abc import Callable

import numpy as np
import orjson
import xgboost as xgb

from _harness import markdown_table
from slorouter.bench.samples import generate_samples
from slorouter.clock import ManualClock
from slorouter.predictor.features import DEFAULT_SCHEMA, ModelKind
from slorouter.predictor.forest import CompiledForest
from slorouter.predictor.forest_compiler import pack_booster
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.predictor import Predictor
from slorouter.predictor.store import SampleStore
from slorouter.predictor.trainer import Trainer, TrainerConfig


def median_ms(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms of each step, the steps called in turn (so that all see the same machine load)."""
    times: dict[str, list[float]] = {label: [] for label in steps}
    for fn in steps.values():
        fn()
    for _ in range(repeats):
        for label, fn in steps.items():
            started = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - started)
    return {label: float(np.median(t)) * 1000.0 for label, t in times.items()}


def model_steps(kind: ModelKind, raw: bytes, repeats: int) -> list[tuple[str, str, float]]:
    booster = xgb.Booster()
    booster.load_model(bytearray(raw))
    booster.set_param({"nthread": 1})
    n = len(DEFAULT_SCHEMA.features(kind))

    steps = {
        "xgb.Booster.load_model": lambda: xgb.Booster().load_model(bytearray(raw)),
        "read trees: save_raw('json') + orjson": lambda: orjson.loads(booster.save_raw("json")),
        "pack_booster (read + pack)": lambda: pack_booster(booster, n),
        "CompiledForest.from_booster": lambda: CompiledForest.from_booster(booster, n),
    }
    return [(kind, label, ms) for label, ms in median_ms(steps, repeats).items()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    samples = generate_samples(4000, seed=0)
    model_dir = tempfile.mkdtemp(prefix="bench-model-load-")
    store = SampleStore()
    for kind in ("ttft", "tpot"):
        store.add(kind, *samples.dataset(kind))
    Trainer(store, ModelStore(model_dir), TrainerConfig(nthread=1), ManualClock()).maybe_train()

    rows = []
    for kind in ("ttft", "tpot"):
        loaded = ModelStore(model_dir).load(kind)
        assert loaded is not None
        rows += model_steps(kind, loaded[0], args.repeats)

    def refresh() -> None:
        predictor = Predictor(ModelStore(model_dir))
        assert predictor.refresh() and predictor.status()["evaluator"] == "compiled, both models in one pass"

    rows += [
        ("both", label, ms) for label, ms in median_ms({"Predictor.refresh": refresh}, args.repeats).items()
    ]

    print(f"command: {' '.join([sys.executable.split('/')[-1], *sys.argv])}")
    calibration = min(timeit.repeat("sum(range(10000))", number=200, repeat=5)) / 200 * 1e6
    print(f"sum(range(10000)) = {calibration:.0f} µs, load average {os.getloadavg()[0]:.1f}\n")
    print(markdown_table(["model", "step", "median ms"], [(k, s, f"{v:.1f}") for k, s, v in rows]))


if __name__ == "__main__":
    main()
