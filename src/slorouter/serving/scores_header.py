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

import numpy as np

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


# Up to this many candidates the order is sorted in plain Python; beyond it by numpy (one stable argsort in C
# against a Python sort with a key per candidate).
PYTHON_ORDER_MAX_CANDIDATES = 16


def listing_order(record: PickRecord, max_candidates: int) -> list[int]:
    """The listed candidates' indices in header order: chosen, runner-up, the others by score, filtered
    ones last; at most ``max_candidates``."""
    chosen, runner_up = record.chosen, record.runner_up
    head = [chosen] if runner_up == NO_RUNNER_UP else [chosen, runner_up]
    room = max_candidates - len(head)
    if room <= 0:
        return head[:max_candidates]
    n = len(record.scores)
    if n <= PYTHON_ORDER_MAX_CANDIDATES:
        scores = record.scores.tolist()
        rest = [i for i in range(n) if i != chosen and i != runner_up]
        rest.sort(key=lambda i: -scores[i] if scores[i] == scores[i] else math.inf)  # stable; NaN last
        return head + rest[:room]
    rank = np.where(np.isnan(record.scores), np.inf, -record.scores)
    rank[head] = -np.inf  # first, and dropped below
    best = np.argsort(rank, kind="stable")[len(head) : len(head) + room]
    return head + best.tolist()


def pick_scores(record: PickRecord, max_candidates: int) -> PickScores:
    order = listing_order(record, max_candidates)
    scores = record.scores[order].tolist()
    prefix = record.prefix_tokens[order].tolist()
    ttft = None if record.ttft_ms is None else record.ttft_ms[order].tolist()
    endpoints = record.endpoints
    entries = []
    scored = []
    for k, i in enumerate(order):
        address = endpoints[i].address
        score = scores[k]
        if score == score:
            entry = f"{address};score={score:.3f}"
            scored.append((address, score))
        else:
            entry = f"{address};filtered"
        if ttft is not None and math.isfinite(ttft[k]):
            entry += f";ttft={ttft[k]:.1f}"
        entries.append(f"{entry};prefix={prefix[k]}")
    runner_up = None if record.runner_up == NO_RUNNER_UP else endpoints[record.runner_up].address
    return PickScores(",".join(entries), runner_up, len(record) - len(order), tuple(scored))
