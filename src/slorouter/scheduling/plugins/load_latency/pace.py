"""Each pod's recent decode pace: milliseconds per output token of its finished streams."""

from __future__ import annotations

import math

import numpy as np


class DecodePace:
    """Per pod: a moving mean of the time per output token of its recent streams (end of stream − first
    token, over the tokens after the first), the pace at which a request sent there now would decode.

    It is what the pod's decode batches and its GPU class make of every token, measured rather than
    modelled: a pod twice as slow per step, or running twice the batch, shows twice the pace. It lags the
    pod's load by the streams in flight (a mean over ``half_life_streams`` finished streams), which is why
    the scorer charges only the difference from the fastest candidate, not the pace itself."""

    def __init__(self, *, half_life_streams: float = 8.0) -> None:
        self._alpha = 1.0 - 0.5 ** (1.0 / half_life_streams)
        self._pace_ms: dict[str, float] = {}

    def observe(self, pod: str, first_token_at: float, completed_at: float, tokens: int) -> None:
        """One finished stream of ``tokens`` output tokens (clock times in seconds); streams of one token,
        or whose clock went backwards, carry no pace."""
        if tokens < 2:
            return
        pace = (completed_at - first_token_at) * 1000.0 / (tokens - 1)
        if not (pace > 0 and math.isfinite(pace)):
            return
        mean = self._pace_ms.get(pod)
        self._pace_ms[pod] = pace if mean is None else mean + self._alpha * (pace - mean)

    def of(self, pods: list[str]) -> np.ndarray:
        """Each pod's pace (ms per token); NaN for a pod with no finished stream yet."""
        return np.array([self._pace_ms.get(p, math.nan) for p in pods])

    def pods(self) -> set[str]:
        return set(self._pace_ms)

    def forget(self, pod: str) -> None:
        self._pace_ms.pop(pod, None)
