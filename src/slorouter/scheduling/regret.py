"""Routing regret of one pick, from the router's own view at the pick (its ``PickRecord``).

- TTFT regret: the chosen candidate's expected TTFT minus the lowest any candidate had (ms, ≥ 0); None when
  the pipeline estimated no TTFT, or none for the chosen candidate.
- Reuse: the prompt tokens the chosen candidate held in its prefix cache (achieved) against the most any
  candidate held (reachable); the difference is the prefill the choice cost (avoidable prefill tokens).

"Any candidate" is every candidate the primary profile was given: the healthy endpoints (those with lane
room, for a request of flow control's priority lane), before the profile's filters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slorouter.scheduling.pick_record import PickRecord


@dataclass(frozen=True, slots=True)
class Regret:
    ttft_regret_ms: float | None
    achieved_prefix_tokens: int
    reachable_prefix_tokens: int

    @property
    def avoidable_prefill_tokens(self) -> int:
        return self.reachable_prefix_tokens - self.achieved_prefix_tokens


def regret_of(record: PickRecord) -> Regret:
    achieved = int(record.prefix_tokens[record.chosen])
    reachable = int(record.prefix_tokens.max())
    return Regret(ttft_regret_of(record), achieved, reachable)


def ttft_regret_of(record: PickRecord) -> float | None:
    ttft = record.ttft_ms
    if ttft is None:
        return None
    chosen = float(ttft[record.chosen])
    if not np.isfinite(chosen):
        return None
    finite = ttft[np.isfinite(ttft)]
    return max(0.0, chosen - float(finite.min()))
