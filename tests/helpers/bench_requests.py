"""Requests for the benchmark's cluster simulator."""

from __future__ import annotations

import numpy as np

from slorouter.bench.workloads import BenchRequest


def chat_requests(n: int, qps: float, seed: int = 0, **fields: object) -> list[BenchRequest]:
    """Poisson arrivals of short prompts over 4 shared system prompts."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / qps, n))
    systems = [f"S{g:03d}" + "s" * (4 * 256 - 4) for g in range(4)]
    return [
        BenchRequest(
            arrival=float(t),
            prompt=systems[int(rng.integers(4))] + "q" * (4 * int(rng.integers(20, 400))),
            max_tokens=int(rng.integers(16, 200)),
            **fields,  # type: ignore[arg-type]
        )
        for t in arrivals
    ]
