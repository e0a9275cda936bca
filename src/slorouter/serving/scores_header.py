"""Scores on the wire (``audit.scores_header``): a pick's candidates as the response header
``x-slorouter-scores``, the span attribute of the same value, and the picker's ``envoy.lb`` dynamic metadata.

The header lists at most ``scores_max_candidates`` entries, ``ADDRESS;score=S[;ttft=MS];prefix=TOKENS``
(``filtered`` instead of a score for a candidate a filter removed; ``ttft`` where the pipeline estimated
one), comma-separated: the chosen candidate first, then the runner-up, then the others by score, those a
filter removed last. The cut ones are counted in ``x-slorouter-scores-omitted``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slorouter.scheduling.pick_record import NO_RUNNER_UP, PickRecord

SCORES_HEADER = "x-slorouter-scores"
RUNNER_UP_HEADER = "x-slorouter-runner-up"
SCORES_OMITTED_HEADER = "x-slorouter-scores-omitted"
# The picker's envoy.lb key (llm-d's proposed endpoint-scores metadata: address → score, scored ones only).
ENDPOINT_SCORES_KEY = "x-gateway-destination-endpoint-scores"


@dataclass(frozen=True, slots=True)
class PickScores:
    """What goes on the wire for one pick."""

    header: str  # the x-slorouter-scores value
    runner_up: str | None  # its address; None: the chosen candidate was the only one scored
    omitted: int  # candidates cut from the header
    scored: tuple[tuple[str, float], ...]  # (address, score) of the listed candidates a filter kept


def listing_order(record: PickRecord, scores: list[float]) -> list[int]:
    """Candidate indices in header order: chosen, runner-up, the others by score, filtered ones last
    (``scores``: the record's, as a list)."""
    chosen, runner_up = record.chosen, record.runner_up
    head = [chosen] if runner_up == NO_RUNNER_UP else [chosen, runner_up]
    rest = [i for i in range(len(scores)) if i != chosen and i != runner_up]
    rest.sort(key=lambda i: -scores[i] if scores[i] == scores[i] else math.inf)  # stable; NaN last
    return head + rest


def pick_scores(record: PickRecord, max_candidates: int) -> PickScores:
    scores = record.scores.tolist()
    order = listing_order(record, scores)[:max_candidates]
    prefix = record.prefix_tokens.tolist()
    ttft = None if record.ttft_ms is None else record.ttft_ms.tolist()
    endpoints = record.endpoints
    entries = []
    scored = []
    for i in order:
        address = endpoints[i].address
        score = scores[i]
        if score == score:
            entry = f"{address};score={score:.3f}"
            scored.append((address, score))
        else:
            entry = f"{address};filtered"
        if ttft is not None and math.isfinite(ttft[i]):
            entry += f";ttft={ttft[i]:.1f}"
        entries.append(f"{entry};prefix={prefix[i]}")
    runner_up = None if record.runner_up == NO_RUNNER_UP else endpoints[record.runner_up].address
    return PickScores(",".join(entries), runner_up, len(scores) - len(order), tuple(scored))
