"""What one pick saw and did, kept only when something asks for it (routing regret, the scores header).

A ``PickRecord`` covers the candidates the primary profile was given (before its filters), as arrays aligned
with them: each one's total score (NaN where a filter removed it), its expected TTFT when the pipeline
predicted or estimated one, and the prompt tokens it holds in its prefix cache; which one was chosen, the
runner-up, and why the choice was made (``PickReason``). Building one costs a few numpy calls over the
candidates; a cycle that does not ask for it builds none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from slorouter.pool.state import Endpoint
from slorouter.scheduling.datakeys import (
    EXPECTED_TTFT_MS,
    PREDICTED_TTFT_MS,
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
)
from slorouter.scheduling.types import Candidates, InferenceRequest, PickReason


class TtftSource(StrEnum):
    """Where a record's expected TTFT comes from."""

    PREDICTOR = "predictor"  # predicted-latency-producer's predictions
    LOAD_MODEL = "load-model"  # load-latency-producer's expected TTFT
    NONE = "none"  # the pipeline estimated no TTFT


NO_RUNNER_UP = -1


@dataclass(slots=True)
class PickRecord:
    """One pick of one profile (see the module docstring). Arrays are aligned with ``endpoints``."""

    profile: str
    endpoints: list[Endpoint]
    scores: np.ndarray  # float64 total score; NaN: removed by a filter (never scored)
    ttft_ms: np.ndarray | None  # float64 expected TTFT (ms) from ``ttft_source``; None: no estimate
    ttft_source: TtftSource
    prefix_tokens: np.ndarray  # int64 prompt tokens held in the candidate's prefix cache (0: no prefix data)
    prompt_tokens: int
    chosen: int
    runner_up: int  # the best-scored candidate after the chosen one; NO_RUNNER_UP: none was scored
    reason: PickReason

    def __len__(self) -> int:
        return len(self.endpoints)


def prefix_tokens_held(request: InferenceRequest, candidates: Candidates) -> np.ndarray:
    """Prompt tokens each candidate holds: min(matched blocks × block size, prompt); 0 without prefix data."""
    matched = candidates.attrs.get(PREFIX_MATCH_BLOCKS)
    block_size = candidates.attrs.get(PREFIX_BLOCK_SIZE_TOKENS)
    if matched is None or block_size is None:
        return np.zeros(len(candidates), dtype=np.int64)
    return np.minimum(matched * block_size, request.prompt_tokens)


def expected_ttft(candidates: Candidates) -> tuple[np.ndarray | None, TtftSource]:
    predicted = candidates.attrs.get(PREDICTED_TTFT_MS)
    if predicted is not None:
        return predicted, TtftSource.PREDICTOR
    expected = candidates.attrs.get(EXPECTED_TTFT_MS)
    if expected is not None:
        return expected, TtftSource.LOAD_MODEL
    return None, TtftSource.NONE


def runner_up_in_array(total: np.ndarray, chosen: int) -> tuple[int, float]:
    """The best-scored candidate after ``chosen`` (the first of equals) and its total."""
    if len(total) < 2:
        return NO_RUNNER_UP, -np.inf
    kept = total[chosen]
    total[chosen] = -np.inf
    runner_up = int(total.argmax())
    best_other = float(total[runner_up])
    total[chosen] = kept
    return runner_up, best_other


def runner_up_in_list(total: list[float], chosen: int) -> tuple[int, float]:
    """``runner_up_in_array`` over a list (the same answer, without numpy)."""
    runner_up, best_other = NO_RUNNER_UP, -np.inf
    for i, value in enumerate(total):
        if value > best_other and i != chosen:
            runner_up, best_other = i, value
    return runner_up, best_other


def record_pick(
    profile: str,
    request: InferenceRequest,
    given: Candidates,
    scored: Candidates,
    total: np.ndarray | list[float],
    chosen: int,
    reason: PickReason | None,
) -> PickRecord:
    """The record of a profile that was ``given`` some candidates, scored those its filters kept
    (``scored``, with ``total``) and chose ``scored``'s candidate ``chosen``. ``reason``: what a filter said
    (None: nothing), refined here: a narrowed set without a reason is ``FILTER``, a chosen candidate below
    the top score is ``PICKER``. ``total`` is not copied: the profile is done with it."""
    n = len(given)
    # A profile's totals never hold NaN, so plain comparisons suffice. The list path's totals (a handful of
    # candidates) are searched in plain Python, where numpy's per-call overhead would be the cost.
    if isinstance(total, np.ndarray):
        total_array = total
        runner_up, best_other = runner_up_in_array(total_array, chosen)
    else:
        runner_up, best_other = runner_up_in_list(total, chosen)
        total_array = np.array(total, dtype=np.float64)
    if runner_up != NO_RUNNER_UP and best_other > total[chosen] and reason in (None, PickReason.FILTER):
        reason = PickReason.PICKER
    if len(scored) == n:  # no filter removed a candidate: the same order (subset keeps order)
        scores = total_array
    else:
        # Where each scored candidate sits among the given ones (pool positions are unique).
        where = np.empty(int(given.positions.max()) + 1, dtype=np.int64)
        where[given.positions] = np.arange(n)
        index = where[scored.positions]
        scores = np.full(n, np.nan)
        scores[index] = total_array
        chosen = int(index[chosen])
        if runner_up != NO_RUNNER_UP:
            runner_up = int(index[runner_up])
    if reason is None:
        reason = PickReason.FILTER if len(scored) < n else PickReason.SCORE
    ttft_ms, source = expected_ttft(given)
    return PickRecord(
        profile=profile,
        endpoints=given.endpoints,
        scores=scores,
        ttft_ms=ttft_ms,
        ttft_source=source,
        prefix_tokens=prefix_tokens_held(request, given),
        prompt_tokens=request.prompt_tokens,
        chosen=chosen,
        runner_up=runner_up,
        reason=reason,
    )
