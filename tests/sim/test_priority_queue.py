"""The engine's priority queue (engine variant queue=priority, vLLM's --scheduling-policy priority): the
waiting queue's order and the preemption victim."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from slorouter.sim.engine import Engine
from slorouter.sim.profiles import LLAMA3_8B_H100
from slorouter.sim.variants import parse_variant
from tests.sim.conftest import distinct_prompt, drive

# No API overheads and no jitter; one request runs at a time, so admission order is the queue's order.
ONE_SEAT = replace(
    LLAMA3_8B_H100, api_pre_ms=0.0, api_post_ms=0.0, api_per_token_ms=0.0, jitter_sigma=0.0, max_num_seqs=1
)
# A KV cache that runs out within a few steps: 40 blocks of 16 tokens, 64-token chunks.
TIGHT = replace(
    LLAMA3_8B_H100,
    api_pre_ms=0.0,
    api_post_ms=0.0,
    api_per_token_ms=0.0,
    jitter_sigma=0.0,
    num_gpu_blocks=40,
    max_model_len=640,
    max_num_batched_tokens=256,
    max_num_seqs=16,
    long_prefill_token_threshold=64,
)


def by_priority(profile):
    return parse_variant("priority-queue").apply(profile)


def admission_order(engine: Engine, arrivals) -> list[object]:
    run = drive(engine, arrivals)
    return sorted(run.finished, key=lambda rid: run.finished[rid].scheduled_time)


def queued_behind_a_blocker() -> list[tuple[object, list[int], int, float, int]]:
    """A long request takes the one seat at t=0; five more queue behind it with mixed priorities."""
    blocker = ("blocker", distinct_prompt(0, 32), 20, 0.0, 9)
    queued = [("a", 5), ("b", 1), ("c", 5), ("d", 1), ("e", -2)]
    return [blocker] + [
        (rid, distinct_prompt(i + 1, 32), 2, 0.001 * (i + 1), priority)
        for i, (rid, priority) in enumerate(queued)
    ]


def test_the_priority_queue_admits_by_priority_then_arrival():
    order = admission_order(Engine(by_priority(ONE_SEAT)), queued_behind_a_blocker())
    assert order == ["blocker", "e", "b", "d", "a", "c"]


def test_fcfs_ignores_the_priority():
    order = admission_order(Engine(ONE_SEAT), queued_behind_a_blocker())
    assert order == ["blocker", "a", "b", "c", "d", "e"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-3, 3), st.floats(0, 0.2, allow_nan=False), st.integers(1, 6)),
        min_size=1,
        max_size=12,
    )
)
def test_no_waiting_request_is_passed_over_by_a_larger_priority_key(specs):
    arrivals = [
        (i, distinct_prompt(i, 16 + 8 * i), max_tokens, at, priority)
        for i, (priority, at, max_tokens) in enumerate(specs)
    ]
    run = drive(Engine(by_priority(ONE_SEAT)), arrivals)
    assert set(run.finished) == set(range(len(specs)))
    key = {i: (priority, at, i) for i, (priority, at, _) in enumerate(specs)}
    for r in run.finished.values():
        for w in run.finished.values():
            waiting_then = w.queued_time <= r.scheduled_time < w.scheduled_time
            assert not (waiting_then and key[w.request_id] < key[r.request_id]), (w, r)


def two_long_decodes(low_first: bool) -> list[tuple[object, list[int], int, float, int]]:
    """Two requests that together outgrow the 40-block cache while decoding."""
    first, second = ("low", 9), ("high", 0)
    if not low_first:
        first, second = second, first
    return [
        (first[0], distinct_prompt(1, 100), 300, 0.0, first[1]),
        (second[0], distinct_prompt(2, 100), 300, 0.0001, second[1]),
    ]


def test_the_priority_victim_is_the_largest_priority_and_arrival_not_the_newest():
    run = drive(Engine(by_priority(TIGHT)), two_long_decodes(low_first=True))
    assert run.finished["low"].num_preemptions >= 1  # the older one, of the larger priority value
    assert run.finished["high"].num_preemptions == 0
    assert all(done.output_tokens == 300 for done in run.finished.values())


def test_the_fcfs_victim_is_the_newest():
    run = drive(Engine(TIGHT), two_long_decodes(low_first=True))
    assert run.finished["high"].num_preemptions >= 1
    assert run.finished["low"].num_preemptions == 0


def test_between_equal_priorities_the_later_arrival_is_the_victim():
    arrivals = [(rid, prompt, n, at, 0) for rid, prompt, n, at, _ in two_long_decodes(low_first=True)]
    run = drive(Engine(by_priority(TIGHT)), arrivals)
    assert run.finished["high"].num_preemptions >= 1  # arrived 0.1 ms later
    assert run.finished["low"].num_preemptions == 0


def run_to_idle(engine: Engine, now: float) -> list[object]:
    """Step the engine from ``now`` until idle; the requests in the order they finished."""
    finished = []
    while engine.has_work():
        step = engine.plan_step(now)
        if step is None:
            ready = engine.next_ready_time()
            assert ready is not None
            now = ready
            continue
        finished += [done.request_id for done in engine.commit_step(step).finished]
        now = step.end
    return finished


def test_a_victim_already_scheduled_in_the_step_gives_its_chunk_back():
    # "low" is admitted first and prefills 64 tokens a step, "high" from the second step on, after it in
    # admission order. When the cache runs out, "low" has already been given its chunk of the step being
    # built, and "high", needing blocks, preempts it.
    engine = Engine(by_priority(TIGHT))
    engine.add_request("low", distinct_prompt(1, 600), 1, 0.0, 9)
    engine.add_request("high", distinct_prompt(2, 400), 1, 0.005, 0)
    now = 0.0
    while True:
        step = engine.plan_step(now)
        assert step is not None
        if step.num_preempted:
            break
        engine.commit_step(step)
        now = step.end
    # Only "high"'s chunk is in the step (without the refund: 128 tokens); "low" waits.
    assert (step.num_prefill_tokens, engine.num_running, engine.num_waiting) == (64, 1, 1)
    engine.commit_step(step)
    assert run_to_idle(engine, step.end) == ["high", "low"]


def test_aborting_a_waiting_request_under_the_priority_queue():
    engine = Engine(by_priority(ONE_SEAT))
    for arrival in queued_behind_a_blocker():
        engine.add_request(*arrival)
    step = engine.plan_step(0.0)  # the blocker takes the seat
    assert step is not None
    engine.commit_step(step)
    step = engine.plan_step(step.end)  # the others have reached the queue
    assert step is not None and engine.num_waiting == 5
    assert engine.abort("b") and engine.abort("e") and engine.num_waiting == 3
    engine.commit_step(step)
    assert run_to_idle(engine, step.end) == ["blocker", "d", "a", "c"]
