"""The prediction server's JSON bulk response, ``{"predictions": [{"ttft_ms": x, "tpot_ms": y}, ...],
"model_versions": {...}}``, written two ways for the same predictions (the same bytes):

- byte replacement (what the server did before, kept here for the comparison): one orjson array of [ttft,
  tpot] pairs from numpy, turned into the objects by replacing ``],[`` and ``,`` (no Python object per row);
- plain (what ``slorouter.predictor.wire.encode_predictions`` does): orjson of a list of dicts (rounded
  values from ``tolist()``; orjson writes a NaN TPOT as null).

Each is checked to give the bytes ``encode_predictions`` gives, then both are timed
in turn (median µs per call over ``--iterations`` calls), for ``--rows`` predictions with a third of the
TPOTs NaN (no TPOT model yet) and without.

    .venv/bin/python benchmarks/bench_bulk_response.py [--rows 100 1000] [--iterations 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import timeit
from collections.abc import Callable

import numpy as np
import orjson

from _harness import markdown_table
from slorouter.predictor.wire import encode_predictions

VERSIONS = {"ttft": "20261201T204500.123456-1a2b3c4d", "tpot": "20261201T204500.234567-5e6f7a8b"}


def byte_replacement(ttft: np.ndarray, tpot: np.ndarray, versions: dict[str, str]) -> bytes:
    pairs = np.empty((len(ttft), 2), dtype=np.float64)
    np.round(ttft, 3, out=pairs[:, 0])
    np.round(tpot, 3, out=pairs[:, 1])
    numbers = orjson.dumps(pairs, option=orjson.OPT_SERIALIZE_NUMPY)[2:-2]  # a,b],[c,d
    predictions = b'{"ttft_ms":%s}' % (
        numbers.replace(b"],[", b"}{").replace(b",", b',"tpot_ms":').replace(b"}{", b'},{"ttft_ms":')
    )
    return b'{"predictions":[%s],"model_versions":%s}' % (predictions, orjson.dumps(versions))


def plain(ttft: np.ndarray, tpot: np.ndarray, versions: dict[str, str]) -> bytes:
    rounded = zip(np.round(ttft, 3).tolist(), np.round(tpot, 3).tolist(), strict=True)
    predictions = [{"ttft_ms": a, "tpot_ms": b} for a, b in rounded]
    return orjson.dumps({"predictions": predictions, "model_versions": versions})


def medians_us(steps: dict[str, Callable[[], object]], iterations: int) -> dict[str, float]:
    """Median µs per call of each step, the steps called in turn (so that all see the same machine load)."""
    times: dict[str, list[float]] = {label: [] for label in steps}
    perf = time.perf_counter
    for _ in range(iterations):
        for label, fn in steps.items():
            started = perf()
            fn()
            times[label].append(perf() - started)
    return {label: float(np.median(t)) * 1e6 for label, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    table = []
    for n in args.rows:
        for with_nan in (False, True):
            ttft = rng.lognormal(5, 1, n)
            tpot = rng.lognormal(3, 0.5, n)
            if with_nan:
                tpot[::3] = np.nan
            versions = VERSIONS if not with_nan else {"ttft": VERSIONS["ttft"]}
            shipped = encode_predictions(ttft, tpot, versions)
            variants = {
                "byte replacement": lambda: byte_replacement(ttft, tpot, versions),  # noqa: B023
                "plain": lambda: plain(ttft, tpot, versions),  # noqa: B023
            }
            assert all(fn() == shipped for fn in variants.values())
            medians = medians_us(variants, args.iterations)
            table.append((n, "yes" if with_nan else "no", *(f"{us:.1f}" for us in medians.values())))

    print(f"command: {' '.join([sys.executable.split('/')[-1], *sys.argv])}")
    calibration = min(timeit.repeat("sum(range(10000))", number=200, repeat=5)) / 200 * 1e6
    print(f"sum(range(10000)) = {calibration:.0f} µs, load average {os.getloadavg()[0]:.1f}\n")
    print(markdown_table(["rows", "NaN TPOTs", "byte replacement µs", "plain µs"], table))


if __name__ == "__main__":
    main()
