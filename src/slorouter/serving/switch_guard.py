"""The guard after an automatic switch of the routing pipeline: undo it at once when TTFT collapses.

The tuner switches only on a predicted gain, but its twin can be wrong. For ``watch_s`` after a switch, every
``period_s`` the guard compares the TTFT p90 of the requests that arrived in the last ``period_s`` (those
answered so far) with the TTFT p90 of the ``period_s`` before the switch; above ``ratio`` times that, it says
to go back to the previous candidate. A check needs ``min_requests`` answered requests in its period.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slorouter.serving.traffic_window import WindowEntry


@dataclass(frozen=True, slots=True)
class Watch:
    at: float  # when the switch took effect
    previous: str  # the candidate to go back to
    before_p90_ms: float  # TTFT p90 of the period before the switch


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

    def switched(self, entries: Sequence[WindowEntry], *, at: float, previous: str) -> None:
        """A switch away from ``previous`` took effect at ``at``: watch it (when the period before it had
        enough requests to compare with)."""
        before = ttft_p90_ms(entries, at - self.period_s, at, self.min_requests)
        self.watch = None if math.isnan(before) else Watch(at, previous, before)

    def check(self, entries: Sequence[WindowEntry], now: float) -> str | None:
        """The candidate to go back to, when the last period collapsed; None otherwise."""
        watch = self.watch
        if watch is None:
            return None
        if now - watch.at > self.watch_s:
            self.watch = None
            return None
        after = ttft_p90_ms(entries, max(now - self.period_s, watch.at), now, self.min_requests)
        if not math.isnan(after) and after > self.ratio * watch.before_p90_ms:
            self.watch = None
            return watch.previous
        return None


def ttft_p90_ms(entries: Sequence[WindowEntry], start: float, end: float, min_requests: int) -> float:
    """TTFT p90 of the requests that arrived in [start, end) (a failed one counts as infinitely slow); NaN
    with fewer than ``min_requests``."""
    values = [math.inf if e.ttft_ms is None else e.ttft_ms for e in entries if start <= e.arrival < end]
    if len(values) < min_requests:
        return math.nan
    return float(np.quantile(np.array(values), 0.9, method="inverted_cdf"))
