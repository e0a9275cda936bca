"""Open-loop arrival processes: Poisson, and Poisson alternating between a low and a high rate."""

from __future__ import annotations

import numpy as np


def poisson(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate`` per second on ``[start, end)``."""
    if rate <= 0 or end <= start:
        return np.empty(0)
    expected = rate * (end - start)
    chunk = int(expected + 6 * expected**0.5) + 16  # enough in one draw almost always
    times: list[np.ndarray] = []
    t = start
    while True:
        arrivals = t + np.cumsum(rng.exponential(1.0 / rate, chunk))
        inside = arrivals[arrivals < end]
        times.append(inside)
        if len(inside) < chunk:
            return np.concatenate(times)
        t = float(arrivals[-1])


def alternating_poisson(
    rng: np.random.Generator, qps: float, duration: float, ratio: float, phase_s: float
) -> np.ndarray:
    """Poisson arrivals whose rate alternates low, high, low, ... every ``phase_s`` seconds.

    high = ``ratio`` × low and the two phases last equally long, so over whole periods the mean rate is
    ``qps``: low = 2·qps / (1 + ratio). The process is memoryless, so restarting it at each phase boundary
    is exact.
    """
    low = 2.0 * qps / (1.0 + ratio)
    pieces = []
    start, phase = 0.0, 0
    while start < duration:
        end = min(duration, start + phase_s)
        pieces.append(poisson(rng, low * ratio if phase % 2 else low, start, end))
        start, phase = end, phase + 1
    return np.concatenate(pieces) if pieces else np.empty(0)
