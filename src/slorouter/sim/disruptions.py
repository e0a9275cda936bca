"""Stalls and slow periods: a pod's engine time line disrupted, as GC pauses, noisy neighbours and throttled
GPUs disrupt real pods (engine variants ``stall-every-s``/``stall-ms`` and ``slow-factor``/``slow-for-s``/
``slow-every-s``; docs/simulator.md, "Engine variants").

Both are renewal processes on the engine's time line from its start time, drawn lazily from generators
seeded with the engine's seed (one per process, so adding slow periods leaves the stalls where they were).
A pod's schedule therefore depends only on its seed and start time, never on its load: in a benchmark every
policy meets the same stalls on the same pod, and pods with different seeds stall independently.

- **Stalls.** Pauses of a length uniform in ``stall_ms`` (ms), separated by exponentially distributed gaps
  of mean ``stall_every_s`` (from the end of one pause to the start of the next). The engine makes no
  progress during a pause: no step starts in one (``Engine.plan_step`` returns None and
  ``Engine.next_ready_time`` is the pause's end, so requests that arrive meanwhile join the first step
  after it), and a step running when a pause begins is suspended for it (its end moves later by the
  pause's length, and its tokens come out then).
- **Slow periods.** Periods of ``slow_for_s`` seconds, separated by exponentially distributed gaps of mean
  ``slow_every_s``; a step that starts inside one takes ``slow_factor`` times its normal time (a step that
  starts just before one keeps its normal time: steps are milliseconds, periods seconds).
"""

from __future__ import annotations

import math
import random

from slorouter.sim.profiles import Profile


def disrupted(profile: Profile) -> bool:
    """Whether the profile has stalls or slow periods (an engine without either never consults them)."""
    return profile.stall_every_s > 0 or profile.slow_every_s > 0


class Disruptions:
    """One engine's stalls and slow periods. Times must be asked in non-decreasing order."""

    __slots__ = (
        "_pause_rng",
        "_profile",
        "_slow_rng",
        "pause_end",
        "pause_start",
        "slow_end",
        "slow_start",
    )

    def __init__(self, profile: Profile, seed: int, start: float = 0.0) -> None:
        self._profile = profile
        # String seeds: streams apart from the integer-seeded step jitter of every pod.
        self._pause_rng = random.Random(f"slorouter-sim-stalls-{seed}")
        self._slow_rng = random.Random(f"slorouter-sim-slowdowns-{seed}")
        # The current or next pause and slow period, [start, end); inf: none (ever).
        self.pause_start = self.pause_end = math.inf
        self.slow_start = self.slow_end = math.inf
        if profile.stall_every_s > 0:
            self._next_pause(start)
        if profile.slow_every_s > 0:
            self._next_slow(start)

    def _next_pause(self, after: float) -> None:
        profile = self._profile
        rng = self._pause_rng
        self.pause_start = after + rng.expovariate(1.0 / profile.stall_every_s)
        low, high = profile.stall_ms
        self.pause_end = self.pause_start + rng.uniform(low, high) / 1000.0

    def _next_slow(self, after: float) -> None:
        profile = self._profile
        self.slow_start = after + self._slow_rng.expovariate(1.0 / profile.slow_every_s)
        self.slow_end = self.slow_start + profile.slow_for_s

    def resume_time(self, now: float) -> float:
        """The end of the pause ``now`` falls in; ``now`` itself when the engine is not paused."""
        while self.pause_end <= now:
            self._next_pause(self.pause_end)
        return self.pause_end if self.pause_start <= now else now

    def step_duration(self, start: float, duration: float) -> float:
        """How long a step that starts at ``start`` (outside any pause) and would take ``duration`` takes:
        ``slow_factor`` times as long if it starts in a slow period, plus every pause that begins before
        it ends."""
        if self.slow_start <= start:
            while self.slow_end <= start:
                self._next_slow(self.slow_end)
            if self.slow_start <= start:
                duration *= self._profile.slow_factor
        end = start + duration
        while self.pause_start < end:
            length = self.pause_end - self.pause_start
            duration += length
            end += length
            self._next_pause(self.pause_end)
        return duration

    def schedule(self, until: float) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
        """The pauses and the slow periods, ``(start, end)``, that begin before ``until``, from the current
        ones on. Consumes the schedule: ask a fresh instance (same profile, seed and start)."""
        pauses: list[tuple[float, float]] = []
        while self.pause_start < until:
            pauses.append((self.pause_start, self.pause_end))
            self._next_pause(self.pause_end)
        slow: list[tuple[float, float]] = []
        while self.slow_start < until:
            slow.append((self.slow_start, self.slow_end))
            self._next_slow(self.slow_end)
        return pauses, slow
