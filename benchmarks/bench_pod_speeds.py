"""What ``load-latency-producer``'s per-pod speeds cost per first token: one observation (a pod's speed
equations updated, winsorised against its current estimate) and the next read of every pod's speeds (all
pods re-solved in one vectorised pass, docs/design/pod-speeds.md), on pools of 8 and 100 pods.

    .venv/bin/python benchmarks/bench_pod_speeds.py [--pods 8,100] [--rounds 3000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from slorouter.scheduling.plugins.load_latency import PodSpeeds


def measure(pods: int, rounds: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    names = [f"10.0.0.{i}:8000" for i in range(pods)]
    slowness = np.linspace(0.7, 1.5, pods)  # pods that differ, so the shrinkage keeps part of each speed
    speeds = PodSpeeds()

    def observe() -> None:
        i = int(rng.integers(pods))
        speeds.observe(names[i], float(rng.uniform(0.2, 0.8)), float(slowness[i] * rng.lognormal(0.0, 0.2)))

    for _ in range(2000):  # warm: every pod has samples
        observe()
    speeds.arrays(names)
    times = np.empty(rounds)
    for k in range(rounds):
        started = time.perf_counter()
        observe()
        speeds.arrays(names)
        times[k] = time.perf_counter() - started
    return times * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--pods", default="8,100")
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    for pods in (int(p) for p in args.pods.split(",")):
        us = measure(pods, args.rounds)
        print(
            f"{pods} pods: observe + read every pod's speeds: p50 {np.median(us):.0f} us, "
            f"p90 {np.percentile(us, 90):.0f} us, p99 {np.percentile(us, 99):.0f} us"
        )


if __name__ == "__main__":
    main()
