"""What a model server reports of its engine's load gauges: live, late, or coarse.

Real servers differ here: a metrics exporter that renders from a stats snapshot taken every few seconds, a
sidecar or proxy that caches the page, a gauge that is only recomputed with the engine's periodic stats
log, or a KV-usage figure quantised by the exporter. The profile's ``metrics_delay_ms``,
``metrics_period_ms`` and ``kv_usage_step`` (engine variants ``late-metrics``, ``coarse-metrics``) model it
for the three gauges routers read (waiting requests, running requests, KV-cache usage):

- **late**: the gauges show the engine as it was ``metrics_delay_ms`` ago;
- **coarse**: they change only once per ``metrics_period_ms`` (the first read in each period takes the new
  values), and KV usage is rounded to the nearest multiple of ``kv_usage_step``.

The reporter only knows the engine states it was shown (``sample``): a caller that samples after every
change gets the delay exactly; one that samples only when it reads (the discrete-event runner, at every
scrape) gets it rounded up to its read interval.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

from slorouter.sim.engine import Engine

_EPSILON_S = 1e-9  # times accumulated by repeated addition must still match a delay that is their multiple


class Gauges(NamedTuple):
    waiting: int
    running: int
    kv_usage: float


_IDLE = Gauges(0, 0, 0.0)


class GaugeReporter:
    """The gauges one engine's server reports at a given time."""

    __slots__ = ("_delay_s", "_engine", "_history", "_kv_step", "_next_refresh", "_period_s", "_shown")

    def __init__(self, engine: Engine) -> None:
        profile = engine.profile
        self._engine = engine
        self._delay_s = profile.metrics_delay_ms / 1000.0
        self._period_s = profile.metrics_period_ms / 1000.0
        self._kv_step = profile.kv_usage_step
        self._history: deque[tuple[float, Gauges]] = deque([(-math.inf, _IDLE)])
        self._next_refresh = -math.inf
        self._shown = _IDLE

    @property
    def live(self) -> bool:
        """Reports the engine as it is (no delay, period or rounding)."""
        return not (self._delay_s or self._period_s or self._kv_step)

    @property
    def delayed(self) -> bool:
        return self._delay_s > 0

    def sample(self, now: float) -> None:
        """Record the engine's gauges at ``now`` (only the delay needs a history)."""
        if not self._delay_s:
            return
        engine = self._engine
        history = self._history
        if history[-1][0] >= now:  # a later state at the same time replaces the earlier one
            history.pop()
        history.append((now, Gauges(engine.num_waiting, engine.num_running, engine.kv_usage)))
        horizon = now - self._delay_s + _EPSILON_S
        while len(history) > 1 and history[1][0] <= horizon:
            history.popleft()

    def read(self, now: float) -> Gauges:
        engine = self._engine
        if self.live:
            return Gauges(engine.num_waiting, engine.num_running, engine.kv_usage)
        if self._period_s:
            if now + _EPSILON_S < self._next_refresh:
                return self._shown
            self._next_refresh = (math.floor(now / self._period_s + _EPSILON_S) + 1) * self._period_s
        if self._delay_s:
            self.sample(now)
            gauges = self._history[0][1]
        else:
            gauges = Gauges(engine.num_waiting, engine.num_running, engine.kv_usage)
        if self._kv_step:
            step = self._kv_step
            gauges = gauges._replace(
                kv_usage=min(1.0, round(math.floor(gauges.kv_usage / step + 0.5) * step, 9))
            )
        self._shown = gauges
        return gauges
