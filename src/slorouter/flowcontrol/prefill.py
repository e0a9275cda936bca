"""Each endpoint's prefill throughput, learned from the router's own view of its requests.

A sample is one request's first token: the uncached prompt tokens that were in flight on its endpoint when
it was dispatched (its own included), and the seconds from dispatch to its first token. Under chunked
prefill an endpoint works those tokens off in about that time, so tokens / seconds is its prefill rate at the
decode load of the moment. The estimate is a ratio of decayed sums (Σ tokens / Σ seconds): long prefill
backlogs, the samples that matter near saturation, weigh most, and short requests at light load, whose
time is mostly one engine step, pull it down (the derived bound is then lower, where it gates nothing).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Sums:
    tokens: float = 0.0
    seconds: float = 0.0
    samples: int = 0


class PrefillRates:
    """Per endpoint address: the learned prefill rate in tokens per second, or None before ``min_samples``."""

    __slots__ = ("_sums", "decay", "min_samples")

    def __init__(self, *, decay: float = 1.0 / 512, min_samples: int = 16) -> None:
        if not 0 < decay < 1:
            raise ValueError("decay must be in (0, 1)")
        if min_samples < 1:
            raise ValueError("min_samples must be >= 1")
        self.decay = decay
        self.min_samples = min_samples
        self._sums: dict[str, _Sums] = {}

    def observe(self, address: str, tokens_ahead: int, seconds: float) -> None:
        """One first token on ``address``: ``tokens_ahead`` uncached tokens in flight at dispatch."""
        if tokens_ahead <= 0 or not seconds > 0:
            return
        sums = self._sums.get(address)
        if sums is None:
            sums = self._sums[address] = _Sums()
        keep = 1.0 - self.decay
        sums.tokens = sums.tokens * keep + tokens_ahead
        sums.seconds = sums.seconds * keep + seconds
        sums.samples += 1

    def rate(self, address: str) -> float | None:
        sums = self._sums.get(address)
        if sums is None or sums.samples < self.min_samples:
            return None
        return sums.tokens / sums.seconds
