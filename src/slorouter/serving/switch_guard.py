"""The guard after an automatic switch of the routing pipeline: undo it at once when TTFT collapses.

The tuner switches only on a predicted gain, but its twin can be wrong. Every ``period_s`` for ``watch_s``
after a switch, the guard compares the TTFT p90 of the requests that arrived in a period after the switch
with the TTFT p90 of those that arrived in the ``period_s`` before it; above ``ratio`` times that, it says to
go back to the previous candidate. A period is judged one period after it ends, from the first tokens the
router has seen by then: a request still without one counts as infinitely slow, so a pod that stalls shows
at once, without waiting for whole answers. A period needs ``min_requests`` picked requests to be judged.

A switch back to the pipeline's configured candidate is not watched: it is the safe direction, taken when the
tuner's twin cannot be trusted, and a backlog the previous candidate left would be blamed on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from slorouter.serving.traffic_window import TrafficWindow


@dataclass(slots=True)
class Watch:
    at: float  # when the switch took effect
    previous: str  # the candidate to go back to
    before_p90_ms: float | None = None  # TTFT p90 of the period before the switch, once judged


class SwitchGuard:
    def __init__(
        self, *, period_s: float = 10.0, watch_s: float = 60.0, ratio: float = 1.5, min_requests: int = 20
    ) -> None:
        if not (period_s > 0 and watch_s >= period_s and ratio > 1 and min_requests >= 1):
            raise ValueError("need period_s > 0, watch_s >= period_s, ratio > 1 and min_requests >= 1")
        self.period_s = period_s
        self.watch_s = watch_s
        self.ratio = ratio
        self.min_requests = min_requests
        self.watch: Watch | None = None

    def switched(self, *, at: float, previous: str) -> None:
        """A switch away from ``previous`` took effect at ``at``: watch it."""
        self.watch = Watch(at, previous)

    def check(self, window: TrafficWindow, now: float) -> str | None:
        """The candidate to go back to, when the last period judged collapsed; None otherwise."""
        watch = self.watch
        if watch is None:
            return None
        period = self.period_s
        if now - watch.at > self.watch_s + period:
            self.watch = None
            return None
        if now < watch.at + period:
            return None
        if watch.before_p90_ms is None:
            before = ttft_p90_ms(window, watch.at - period, watch.at, self.min_requests)
            if math.isnan(before):  # too little traffic before the switch to compare with
                self.watch = None
                return None
            watch.before_p90_ms = before
        start = max(now - 2 * period, watch.at)
        after = ttft_p90_ms(window, start, now - period, self.min_requests)
        if not math.isnan(after) and after > self.ratio * watch.before_p90_ms:
            self.watch = None
            return watch.previous
        return None


def ttft_p90_ms(window: TrafficWindow, start: float, end: float, min_requests: int) -> float:
    """TTFT p90 (ms) of the requests picked that arrived in [start, end), those without a first token yet
    counted as infinitely slow; NaN with fewer than ``min_requests``."""
    count, values = window.ttfts(start, end)
    if count < min_requests:
        return math.nan
    padded = np.full(count, np.inf)
    padded[: len(values)] = values[:count]
    return float(np.quantile(padded, 0.9, method="inverted_cdf"))
