from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slorouter.pool.inflight import STEP_MEMORY_HALF_LIFE_S, InFlightHandle, InFlightTracker
from slorouter.pool.state import INFLIGHT_COLUMNS, Endpoint, PoolState

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def counts(pool: PoolState, address: str) -> tuple[int, int, int]:
    return (
        int(pool.value(address, "inflight_requests")),
        int(pool.value(address, "inflight_prefill_tokens")),
        int(pool.value(address, "inflight_decode_tokens")),
    )


@pytest.fixture
def pool() -> PoolState:
    return PoolState([Endpoint(A), Endpoint(B)])


@pytest.fixture
def tracker(pool: PoolState) -> InFlightTracker:
    return InFlightTracker(pool)


def test_dispatch_first_token_finish(pool: PoolState, tracker: InFlightTracker) -> None:
    handle = tracker.dispatch(A, prompt_tokens=100, max_tokens=50)
    assert counts(pool, A) == (1, 100, 0)
    assert tracker.outstanding() == 1
    handle.first_token()
    assert counts(pool, A) == (1, 0, 150)
    assert handle.decoding
    handle.finish()
    assert counts(pool, A) == (0, 0, 0)
    assert handle.finished and tracker.outstanding() == 0
    assert counts(pool, B) == (0, 0, 0)


def test_cached_prompt_tokens_are_not_pending_prefill(pool: PoolState, tracker: InFlightTracker) -> None:
    handle = tracker.dispatch(A, prompt_tokens=100, max_tokens=50, cached_tokens=80)
    assert counts(pool, A) == (1, 20, 0)
    handle.first_token()
    assert counts(pool, A) == (1, 0, 150)  # the whole prompt's KV cache is held while decoding
    handle.finish()
    assert counts(pool, A) == (0, 0, 0)
    early = tracker.dispatch(A, 100, 50, cached_tokens=100)
    assert counts(pool, A) == (1, 0, 0)
    early.finish()
    assert counts(pool, A) == (0, 0, 0)
    with pytest.raises(ValueError, match="cached_tokens <= prompt_tokens"):
        tracker.dispatch(A, 10, 5, cached_tokens=11)
    with pytest.raises(ValueError, match="cached_tokens=-1"):
        tracker.dispatch(A, 10, 5, cached_tokens=-1)
    assert tracker.outstanding() == 0


def test_finish_without_first_token(pool: PoolState, tracker: InFlightTracker) -> None:
    handle = tracker.dispatch(A, 100, 50)
    other = tracker.dispatch(A, 7, 3)
    handle.finish()
    assert counts(pool, A) == (1, 7, 0)
    other.finish()
    assert counts(pool, A) == (0, 0, 0)


def test_every_method_is_idempotent(pool: PoolState, tracker: InFlightTracker) -> None:
    handle = tracker.dispatch(A, 10, 5)
    handle.first_token()
    handle.first_token()
    assert counts(pool, A) == (1, 0, 15)
    handle.finish()
    handle.finish()
    handle.first_token()
    assert counts(pool, A) == (0, 0, 0)
    assert tracker.outstanding() == 0


def test_release_after_removal_is_a_no_op(pool: PoolState, tracker: InFlightTracker) -> None:
    handle = tracker.dispatch(A, 10, 5)
    pool.remove(A)
    handle.first_token()
    handle.finish()
    assert tracker.outstanding() == 0


def test_release_after_removal_and_re_add_leaves_the_new_row_alone(
    pool: PoolState, tracker: InFlightTracker
) -> None:
    stale = tracker.dispatch(A, 10, 5)
    stale_decoding = tracker.dispatch(A, 20, 5)
    stale_decoding.first_token()
    pool.remove(A)
    pool.add(Endpoint(A))
    fresh = tracker.dispatch(A, 3, 1)
    stale.first_token()
    stale.finish()
    stale_decoding.finish()
    assert counts(pool, A) == (1, 3, 0)
    fresh.finish()
    assert counts(pool, A) == (0, 0, 0)


def test_dispatch_to_an_unknown_endpoint(pool: PoolState, tracker: InFlightTracker) -> None:
    handle = tracker.dispatch("10.9.9.9:1", 10, 5)
    pool.add(Endpoint("10.9.9.9:1"))
    handle.first_token()
    handle.finish()
    assert counts(pool, "10.9.9.9:1") == (0, 0, 0)


def test_rejects_negative_token_counts(tracker: InFlightTracker) -> None:
    with pytest.raises(ValueError, match="prompt_tokens=-1"):
        tracker.dispatch(A, -1, 5)
    assert tracker.outstanding() == 0


def test_context_manager_releases_on_error(pool: PoolState, tracker: InFlightTracker) -> None:
    with pytest.raises(RuntimeError), tracker.dispatch(A, 10, 5) as handle:
        handle.first_token()
        raise RuntimeError("upstream broke")
    assert counts(pool, A) == (0, 0, 0)
    assert tracker.outstanding() == 0


async def test_cancellation_releases(pool: PoolState, tracker: InFlightTracker) -> None:
    started = asyncio.Event()

    async def relay() -> None:
        with tracker.dispatch(A, 10, 5) as handle:
            handle.first_token()
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(relay())
    await asyncio.wait_for(started.wait(), 5)
    assert counts(pool, A) == (1, 0, 15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert counts(pool, A) == (0, 0, 0)
    assert tracker.outstanding() == 0 and tracker.leaked() == 0


async def test_timeout_releases(pool: PoolState, tracker: InFlightTracker) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            with tracker.dispatch(A, 10, 5):
                await asyncio.sleep(3600)
    assert counts(pool, A) == (0, 0, 0)
    assert tracker.outstanding() == 0


def test_forgotten_handle_is_released_when_collected(pool: PoolState, tracker: InFlightTracker) -> None:
    handle: InFlightHandle | None = tracker.dispatch(A, 10, 5)
    assert handle is not None
    handle.first_token()
    handle = None
    gc.collect()
    assert counts(pool, A) == (0, 0, 0)
    assert tracker.outstanding() == 0
    assert tracker.leaked() == 1


def test_finished_handles_are_not_leaks(tracker: InFlightTracker) -> None:
    tracker.dispatch(A, 1, 1).finish()
    gc.collect()
    assert tracker.leaked() == 0


def test_counters_never_go_negative(pool: PoolState, tracker: InFlightTracker) -> None:
    rng = np.random.default_rng(11)
    handles: list[InFlightHandle] = []
    for _ in range(2000):
        op = rng.integers(0, 6)
        if op <= 1 or not handles:
            address = A if rng.random() < 0.5 else B
            handles.append(tracker.dispatch(address, int(rng.integers(0, 500)), int(rng.integers(0, 200))))
        elif op == 2:
            handles[int(rng.integers(len(handles)))].first_token()
        elif op in (3, 4):
            handles[int(rng.integers(len(handles)))].finish()
        else:
            address = A if rng.random() < 0.5 else B
            if address in pool and rng.random() < 0.1:
                pool.remove(address)
                pool.add(Endpoint(address))
        for column in INFLIGHT_COLUMNS:
            assert (pool.columns[column] >= 0).all(), column
    for handle in handles:
        handle.finish()
    for column in INFLIGHT_COLUMNS:
        assert (pool.columns[column] == 0).all(), column
    assert tracker.outstanding() == 0


def test_metrics_export(tracker: InFlightTracker) -> None:
    registry = CollectorRegistry()
    tracker.register_metrics(registry)
    handle = tracker.dispatch(A, 1, 1)
    text = generate_latest(registry).decode()
    assert "slorouter_inflight_handles 1.0" in text
    assert "slorouter_inflight_handles_leaked_total 0.0" in text
    handle.finish()
    assert "slorouter_inflight_handles 0.0" in generate_latest(registry).decode()


def test_decoding_requests_are_counted_from_the_first_token_to_the_end(
    pool: PoolState, tracker: InFlightTracker
) -> None:
    def decoding() -> int:
        return int(pool.value(A, "inflight_decoding"))

    first, second = tracker.dispatch(A, 100, 50), tracker.dispatch(A, 10, 5)
    assert decoding() == 0
    first.first_token()
    first.first_token()  # idempotent
    second.first_token()
    assert decoding() == 2
    first.finish()
    first.finish()
    assert decoding() == 1
    second.finish()
    early = tracker.dispatch(A, 100, 50)
    early.finish()  # finished before its first token: never decoding
    assert decoding() == 0


def test_an_endpoint_is_stalled_when_its_requests_decode_and_it_produced_no_token_for_a_while():
    pool = PoolState([Endpoint("a"), Endpoint("b")])
    tracker = InFlightTracker(pool)
    tracker.watch_stalls(0.5, 2.5)
    prefilling = tracker.dispatch("a", 100, 10)
    tracker.progressed("a", 1.0)  # nothing decodes there: not watched
    assert not tracker.stalled("a", 9.0) and tracker.stalled_endpoints(9.0) == []
    decoding = tracker.dispatch("a", 100, 10)
    decoding.first_token()
    tracker.progressed("a", 10.0)
    assert not tracker.stalled("a", 10.4)
    assert tracker.stalled("a", 10.5) and tracker.stalled_endpoints(10.5) == ["a"]
    tracker.progressed("a", 10.6)
    assert not tracker.stalled("a", 10.7)
    decoding.finish()  # nothing decodes there any more: forgotten
    assert not tracker.stalled("a", 20.0) and tracker.stalled_endpoints(20.0) == []
    prefilling.finish()
    assert not tracker.stalled("b", 20.0)


def test_a_stall_is_a_silence_several_times_the_longest_recent_step_and_is_not_remembered_as_one():
    pool = PoolState([Endpoint("a")])
    tracker = InFlightTracker(pool)
    tracker.watch_stalls(0.5, 2.5)
    handle = tracker.dispatch("a", 100, 10)
    handle.first_token()
    tracker.progressed("a", 0.0)
    tracker.progressed("a", 0.4)  # a long step: 0.4 s
    assert not tracker.stalled("a", 0.4 + 0.9) and tracker.stalled("a", 0.4 + 1.0)  # 2.5 × 0.4 s
    tracker.progressed("a", 3.0)  # a 2.6 s stall: not a step
    assert tracker.stalled("a", 3.0 + 1.0)  # still 2.5 × the 0.4 s step
    tracker.progressed("a", 4.0)
    assert not tracker.stalled("a", 4.6)  # about 2.5 × 0.4 s still
    now = 4.0
    while now < 4.0 + 4 * STEP_MEMORY_HALF_LIFE_S:  # short steps for four half-lives: the long one fades
        now += 0.1
        tracker.progressed("a", now)
    assert not tracker.stalled("a", now + 0.45) and tracker.stalled("a", now + 0.5)  # the 0.5 s floor
    handle.finish()
