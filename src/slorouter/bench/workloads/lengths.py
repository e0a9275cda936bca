"""Length distributions, in tokens."""

from __future__ import annotations

import numpy as np


def around(rng: np.random.Generator, mean: float, rel_std: float, size: int) -> np.ndarray:
    """Normal lengths of relative standard deviation ``rel_std``, cut at ±2σ (symmetric, so the mean stays).

    The original's scenarios have "30% variance" on every length; inference-perf draws them from a
    clipped normal distribution.
    """
    if rel_std <= 0:
        return np.full(size, max(1, round(mean)), dtype=np.int64)
    values = rng.normal(mean, rel_std * mean, size)
    values = np.clip(values, mean * (1 - 2 * rel_std), mean * (1 + 2 * rel_std))
    return np.maximum(1, np.rint(values)).astype(np.int64)


def lognormal(rng: np.random.Generator, median: float, sigma: float, cap: int, size: int) -> np.ndarray:
    """Lognormal lengths of the given median and log-space ``sigma``, capped at ``cap``, at least 1."""
    values = rng.lognormal(np.log(median), sigma, size)
    return np.clip(np.rint(values), 1, cap).astype(np.int64)


def log_uniform(rng: np.random.Generator, low: int, high: int, size: int) -> np.ndarray:
    """Lengths whose logarithm is uniform on ``[log low, log high]``: every decade equally likely."""
    values = np.exp(rng.uniform(np.log(low), np.log(high), size))
    return np.clip(np.rint(values), low, high).astype(np.int64)
