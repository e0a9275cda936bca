"""Routing regret of one pick, from the router's own view at the pick (its ``PickRecord``).

- TTFT regret: the chosen candidate's expected TTFT minus the lowest any candidate had (ms, ≥ 0); None when
  the pipeline estimated no TTFT, or none for the chosen candidate.
- Reuse: the prompt tokens the chosen candidate held in its prefix cache (achieved) against the most any
  candidate held (reachable); the difference is the prefill the choice cost (avoidable prefill tokens).

"Any candidate" is every candidate the primary profile was given: the healthy endpoints (those with lane
room, for a request of flow control's priority lane), before the profile's filters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    prefix = record.prefix_tokens.tolist()
    return Regret(ttft_regret_of(record), prefix[record.chosen], max(prefix))


def ttft_regret_of(record: PickRecord) -> float | None:
    if record.ttft_ms is None:
        return None
    ttft = record.ttft_ms.tolist()  # plain floats: cheaper than numpy calls on a handful of candidates
    chosen = ttft[record.chosen]
    if not math.isfinite(chosen):
        return None
    return max(0.0, chosen - min(t for t in ttft if math.isfinite(t)))
