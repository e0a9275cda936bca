"""Training time for 200k samples, side by side for the trainer's objectives (target: ≤ 5 s).

Rows: simulator TTFT samples (``slorouter.bench.samples``), resampled to ``--rows`` with jittered KV usage
and latency so that they spread over the store's buckets like a long-running pool's. Each objective trains
the same store with the default hyper-parameters (200 trees, depth 6) through ``Trainer.train`` — hold-out
and calibration split, XGBoost, hold-out metrics, model save — and reports the wall time and hold-out
figures.

    .venv/bin/python benchmarks/bench_training.py [--rows 200000] [--nthread 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import numpy as np

from slorouter.bench.samples import generate_samples
from slorouter.clock import ManualClock
from slorouter.predictor.model_store import ModelStore
from slorouter.predictor.store import SampleStore, StoreConfig
from slorouter.predictor.trainer import OBJECTIVES, Trainer, TrainerConfig


def build_store(rows: int, seed: int) -> SampleStore:
    rng = np.random.default_rng(seed)
    x_all, y_all = generate_samples(6000, seed=seed).dataset("ttft")
    idx = rng.integers(0, len(y_all), rows)
    X = x_all[idx].copy()
    X[:, 0] = np.clip(X[:, 0] + rng.normal(0, 0.02, rows), 0, 1)
    y = y_all[idx] * rng.lognormal(0, 0.05, rows)
    store = SampleStore(StoreConfig(per_bucket=rows))
    store.add("ttft", X, y)
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--nthread", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    store = build_store(args.rows, args.seed)
    print(f"command: {' '.join(['python', *sys.argv])}")
    print(
        f"{store.count('ttft'):,} TTFT samples, 200 trees, depth 6, nthread={args.nthread}, median of "
        f"{args.repeats}\n"
    )
    print("| objective | train s (median) | min | trained on | hold-out coverage | hold-out MAPE | target |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for objective in OBJECTIVES:
        durations = []
        report = None
        for _ in range(args.repeats):
            trainer = Trainer(
                store,
                ModelStore(tempfile.mkdtemp()),
                TrainerConfig(objective=objective, nthread=args.nthread),  # type: ignore[arg-type]
                ManualClock(),
            )
            report = trainer.train("ttft")
            assert report is not None and report.accepted
            durations.append(report.duration_s)
        assert report is not None
        print(
            f"| {objective} | {statistics.median(durations):.2f} | {min(durations):.2f} | "
            f"{report.train_count:,} | {report.metrics['coverage']:.3f} | "
            f"{report.metrics['mape']:.3f} | ≤ 5 s |"
        )


if __name__ == "__main__":
    main()
