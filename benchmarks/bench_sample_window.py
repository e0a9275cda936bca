"""Saving and restoring the sample window (warm start): what a full default window costs.

The store is filled beyond its capacity (every reachable bucket full: 200,000 TTFT and 50,000 TPOT samples
with the defaults), then, ``--repeats`` times: ``save_window`` (snapshot, encode, checksum, atomic write with
fsyncs) and ``read_window`` + ``SampleStore.restore`` into a fresh store (read, verify, restore). Prints the
file size, its bound and the median times.

    .venv/bin/python benchmarks/bench_sample_window.py [--repeats 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from slorouter.predictor.pool_shape import PoolShape
from slorouter.predictor.sample_window import max_file_bytes, read_window, save_window
from slorouter.predictor.store import SampleStore


def full_store(n: int = 2_000_000, seed: int = 0) -> SampleStore:
    rng = np.random.default_rng(seed)
    store = SampleStore()
    common = [
        rng.random(n),  # kv_cache_percentage: every KV bucket
        rng.integers(1, 4000, n),
        rng.integers(0, 40, n),  # num_request_waiting: every queue bucket
        rng.integers(0, 100, n),
        rng.integers(0, 20_000, n),
        rng.integers(0, 100_000, n),
    ]
    prefix = rng.random(n)
    ttft = np.column_stack([*common, prefix, (1 - prefix) * common[1]]).astype(np.float32)
    store.add("ttft", ttft, rng.random(n) * 100 + 1)
    store.add(
        "tpot", np.column_stack([*common, rng.integers(1, 500, n)]).astype(np.float32), rng.random(n) + 1
    )
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    store = full_store()
    shape = PoolShape(((16, 29_205),))
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        path = Path(directory) / "samples.window"
        saves, restores = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            size = save_window(path, store, shape)
            saves.append(time.perf_counter() - started)
            started = time.perf_counter()
            window = read_window(path)
            assert window is not None
            fresh = SampleStore()
            for kind, saved in window.kinds.items():
                fresh.restore(kind, saved.X, saved.y, saved.seq, saved.total_added, saved.trained_mark)
            restores.append(time.perf_counter() - started)
    print(f"samples: ttft {store.count('ttft')}, tpot {store.count('tpot')}")
    print(f"file: {size} bytes (bound without header {max_file_bytes(store)})")
    save_ms, restore_ms = statistics.median(saves) * 1000, statistics.median(restores) * 1000
    print(f"save: median {save_ms:.0f} ms; read + restore: median {restore_ms:.0f} ms")


if __name__ == "__main__":
    main()
