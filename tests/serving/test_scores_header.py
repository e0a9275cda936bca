"""The scores header: its order (chosen, runner-up, by score, filtered last), its bound, and the same facts
in the HTTP/1.1 lines, the header list and the span attributes."""

from __future__ import annotations

import math

import numpy as np

from slorouter.scheduling.pick_record import NO_RUNNER_UP, PickRecord, TtftSource
from slorouter.scheduling.types import PickReason
from slorouter.serving.headers import RoutingFacts
from slorouter.serving.scores_header import listing_order, pick_scores
from tests.helpers.scheduling import make_pool

NAN = float("nan")


def _record(scores, chosen, runner_up, ttft=None, prefix=None) -> PickRecord:
    n = len(scores)
    return PickRecord(
        profile="p",
        endpoints=list(make_pool(n).endpoints),
        scores=np.asarray(scores, dtype=float),
        ttft_ms=None if ttft is None else np.asarray(ttft, dtype=float),
        ttft_source=TtftSource.NONE if ttft is None else TtftSource.PREDICTOR,
        prefix_tokens=np.asarray(prefix or [0] * n, dtype=np.int64),
        prompt_tokens=64,
        chosen=chosen,
        runner_up=runner_up,
        reason=PickReason.SCORE,
    )


def test_order_is_chosen_runner_up_then_by_score_and_filtered_last():
    # A picker that did not take the top score: chosen 3, runner-up 0 (the best of the others).
    record = _record([0.9, NAN, 0.5, 0.2, 0.7], chosen=3, runner_up=0)
    assert listing_order(record, 8) == [3, 0, 4, 2, 1]
    assert listing_order(record, 3) == [3, 0, 4]


def test_the_numpy_order_on_a_large_pool_is_the_plain_python_one():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = 40
        values = rng.choice([0.1, 0.5, 0.9, NAN], size=n).tolist()  # ties and filtered ones
        kept = [i for i, v in enumerate(values) if v == v] or [0]
        if values[kept[0]] != values[kept[0]]:
            values[kept[0]] = 0.3
        chosen = kept[0]
        others = [i for i in kept if i != chosen]
        runner_up = max(others, key=lambda i: values[i]) if others else NO_RUNNER_UP
        record = _record(values, chosen=chosen, runner_up=runner_up)
        head = [chosen] if runner_up == NO_RUNNER_UP else [chosen, runner_up]
        rest = sorted(
            (i for i in range(n) if i not in head),
            key=lambda i: -values[i] if values[i] == values[i] else math.inf,
        )
        for limit in (2, 8, n):
            assert listing_order(record, limit) == (head + rest)[:limit]


def test_entries_and_their_bound():
    record = _record(
        [0.9, NAN, 0.5, 0.2], chosen=0, runner_up=2, ttft=[100.0, 250.0, NAN, 80.0], prefix=[64, 0, 16, 0]
    )
    scores = pick_scores(record, 3)
    assert scores.header == (
        "10.0.0.1:8000;score=0.900;ttft=100.0;prefix=64,"
        "10.0.0.3:8000;score=0.500;prefix=16,"
        "10.0.0.4:8000;score=0.200;ttft=80.0;prefix=0"
    )
    assert (scores.runner_up, scores.omitted) == ("10.0.0.3:8000", 1)
    assert scores.scored == (("10.0.0.1:8000", 0.9), ("10.0.0.3:8000", 0.5), ("10.0.0.4:8000", 0.2))
    every = pick_scores(record, 8)
    assert every.omitted == 0 and every.header.endswith("10.0.0.2:8000;filtered;ttft=250.0;prefix=0")


def test_a_single_candidate_has_no_runner_up():
    scores = pick_scores(_record([0.4], chosen=0, runner_up=NO_RUNNER_UP), 8)
    assert (scores.header, scores.runner_up, scores.omitted) == (
        "10.0.0.1:8000;score=0.400;prefix=0",
        None,
        0,
    )


def test_the_header_lines_the_header_list_and_the_span_say_the_same():
    scores = pick_scores(_record([0.9, 0.5, 0.1], chosen=0, runner_up=1), 2)
    facts = RoutingFacts("10.0.0.1:8000", "heuristic", scores=scores, pick_reason="score")
    headers = facts.headers()
    assert headers[-3:] == [
        ("x-slorouter-scores", scores.header),
        ("x-slorouter-runner-up", "10.0.0.2:8000"),
        ("x-slorouter-scores-omitted", "1"),
    ]
    lines = facts.head_lines({}).decode()
    assert lines == "".join(f"{name}: {value}\r\n" for name, value in headers)
    span = facts.span_attributes()
    assert span["slorouter.scores"] == scores.header and span["slorouter.runner_up"] == "10.0.0.2:8000"
    assert (span["slorouter.scores_omitted"], span["slorouter.pick_reason"]) == (1, "score")
    plain = RoutingFacts("10.0.0.1:8000", "heuristic")
    assert all(not name.startswith("x-slorouter-scores") for name, _ in plain.headers())
    assert "slorouter.scores" not in plain.span_attributes()


def test_the_header_stays_bounded_on_a_large_pool():
    n = 256
    record = _record(
        list(np.linspace(0, 1, n)), chosen=n - 1, runner_up=n - 2, ttft=[1e6] * n, prefix=[10**6] * n
    )
    scores = pick_scores(record, 64)
    assert scores.omitted == n - 64
    assert len(scores.header) < 64 * 64  # at most 64 entries of ~60 bytes
