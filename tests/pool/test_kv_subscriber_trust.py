"""What the subscriber tells the pod's trust state machine, over real ZMQ on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from slorouter.clock import ManualClock
from slorouter.kvevents.publisher import ZmqEventPublisher
from slorouter.kvevents.wire import BlockStored, KVEventBatch, encode_batch, seq_frame
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_subscriber import KVEventSubscriber, KVSubscriberSet, PublisherAddress, Subscription
from slorouter.pool.kv_trust import TrustReason, TrustState, TrustThresholds

pytestmark = pytest.mark.timeout(20)
WALL = 1_000_000.0  # the router's wall clock in these tests; batches stamped WALL are on time


def stored(*hashes: int) -> BlockStored:
    return BlockStored(list(hashes), None, [], 16, None, "GPU", None)


def frames(seq: int, *hashes: int, ts: float = WALL) -> list[bytes]:
    return [b"kv", seq_frame(seq), encode_batch(KVEventBatch(ts, [stored(*hashes)]))]


@contextlib.asynccontextmanager
async def publishing(*published: int) -> AsyncIterator[ZmqEventPublisher]:
    """A publisher with a replay socket that has published one batch per hash of ``published``."""
    publisher = ZmqEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv")
    publisher.start()
    try:
        for block_hash in published:
            publisher.publish([stored(block_hash)], WALL)
        yield publisher
    finally:
        await publisher.close()


def subscriber(publisher: ZmqEventPublisher | None, *, rebuild_events: int = 3) -> KVEventSubscriber:
    index = KVBlockIndex(trust=TrustThresholds(rebuild_events=rebuild_events), clock=ManualClock(10.0))
    address = PublisherAddress(
        publisher.endpoint if publisher else "tcp://127.0.0.1:1",
        publisher.replay_endpoint if publisher else None,
        "kv",
    )
    return KVEventSubscriber(
        "pod", address, index, replay_timeout_s=0.3, reconnect_s=0.02, wall_clock=ManualClock(WALL)
    )


def state(sub: KVEventSubscriber) -> tuple[TrustState, TrustReason]:
    return sub.trust.state, sub.trust.reason


async def test_a_gap_the_replay_fills_leaves_the_pod_exact() -> None:
    async with publishing(1, 2, 3) as publisher:
        sub = subscriber(publisher)
        await sub.receive(frames(0, 1))
        await sub.receive(frames(2, 3))  # 1 comes from the replay
        assert state(sub) == (TrustState.EXACT, TrustReason.NONE)
        assert sub.trust.transitions[(TrustState.DEGRADED, TrustReason.GAP)] == 1
        assert sub.index.trusted("pod") and sub.index.num_blocks("pod") == 3


async def test_a_gap_seen_while_its_replay_is_awaited_degrades_the_pod() -> None:
    async with publishing() as publisher:
        sub = subscriber(publisher)
        await sub.receive(frames(0, 1))
        seen: list[tuple[TrustState, TrustReason]] = []
        replay = sub._replay

        async def watched(start: int, upto: int) -> Any:
            seen.append(state(sub))
            return await replay(start, upto)

        sub._replay = watched  # type: ignore[method-assign]
        await sub.receive(frames(5, 5))  # the publisher's buffer has nothing: unrecoverable
        assert seen == [(TrustState.DEGRADED, TrustReason.GAP)]
        assert state(sub) == (TrustState.REBUILDING, TrustReason.UNRECOVERED_GAP)
        assert not sub.index.trusted("pod")
        for seq in (6, 7):
            await sub.receive(frames(seq, seq))
        assert state(sub) == (TrustState.EXACT, TrustReason.NONE)  # 3 events since the clear


async def test_a_sequence_that_goes_back_rebuilds_and_a_late_copy_does_not() -> None:
    sub = subscriber(None)
    await sub.receive(frames(0, 1, ts=WALL - 0.5))
    await sub.receive(frames(1, 2, ts=WALL - 0.4))
    await sub.receive(frames(0, 1, ts=WALL - 0.5))  # delivered again, late: older than the last batch
    assert sub.stats.late == 1 and sub.stats.restarts == 0
    assert state(sub) == (TrustState.EXACT, TrustReason.NONE)
    await sub.receive(frames(0, 9))  # a new process: numbered from 0 again, stamped later
    assert sub.stats.restarts == 1
    assert state(sub) == (TrustState.REBUILDING, TrustReason.SEQUENCE_RESTART)
    assert sub.index.num_blocks("pod") == 1


async def test_batches_stamped_seconds_ago_degrade_until_one_is_on_time() -> None:
    sub = subscriber(None)
    await sub.receive(frames(0, 1, ts=WALL - 1.0))
    assert sub.trust.state is TrustState.EXACT
    await sub.receive(frames(1, 2, ts=WALL - 2.5))
    assert state(sub) == (TrustState.DEGRADED, TrustReason.LAG)
    assert not sub.index.trusted("pod")
    await sub.receive(frames(2, 3, ts=WALL - 0.01))
    assert sub.trust.state is TrustState.EXACT


async def test_an_unreadable_batch_rebuilds() -> None:
    sub = subscriber(None)
    await sub.receive(frames(0, 1))
    await sub.receive([b"kv", seq_frame(1), b"\xc1"])
    assert state(sub) == (TrustState.REBUILDING, TrustReason.DECODE_ERROR)


async def test_a_failed_session_degrades_until_the_next_one_hears_the_publisher() -> None:
    async with publishing(1) as publisher:
        sub = subscriber(publisher)
        session = sub._session
        calls = 0

        async def failing_once() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise OSError("connection reset")
            await session()

        sub._session = failing_once  # type: ignore[method-assign]
        sub.start()
        deadline = asyncio.get_running_loop().time() + 5
        while sub.trust.transitions[(TrustState.DEGRADED, TrustReason.SESSION)] == 0:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.005)
        while sub.trust.state is not TrustState.EXACT:  # the second session's join answers
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.005)
        assert sub.stats.reconnects == 1 and sub.index.num_blocks("pod") == 1
        await sub.stop()


async def test_another_pod_at_the_same_address_starts_rebuilding_for_its_identity() -> None:
    index = KVBlockIndex(clock=ManualClock(0.0))
    subscribers = KVSubscriberSet(index, replay_timeout_s=0.1, reconnect_s=0.05)
    publisher = PublisherAddress("tcp://127.0.0.1:1")
    try:
        subscribers.update({"10.0.0.1:8000": Subscription("pod-a", publisher)})
        assert index.trust_of("10.0.0.1:8000").state is TrustState.EXACT  # type: ignore[union-attr]
        subscribers.update({"10.0.0.1:8000": Subscription("pod-a", PublisherAddress("tcp://127.0.0.1:2"))})
        assert index.trust_of("10.0.0.1:8000").state is TrustState.EXACT  # type: ignore[union-attr]
        subscribers.update({"10.0.0.1:8000": Subscription("pod-b", publisher)})
        view = index.trust_of("10.0.0.1:8000")
        assert view is not None and (view.state, view.reason) == (TrustState.REBUILDING, TrustReason.IDENTITY)
    finally:
        await subscribers.stop()


async def test_after_a_sequence_restart_the_new_publishers_earlier_batches_are_replayed() -> None:
    async with publishing() as old:
        sub = subscriber(old)
        for seq in range(6):
            await sub.receive(frames(seq, 100 + seq, ts=WALL - 1))
    async with publishing(1, 2, 3) as new:
        sub.publisher = PublisherAddress(new.endpoint, new.replay_endpoint, "kv")
        await sub.receive(frames(2, 3))  # the SUB socket missed 0 and 1 while it reconnected
        assert state(sub) == (TrustState.REBUILDING, TrustReason.SEQUENCE_RESTART)
        assert sub.index.match([1, 2, 3], ["pod"]) == {"pod": 3}
        assert sub.index.num_blocks("pod") == 3


async def test_a_restart_the_scrape_saw_replays_the_stream_from_its_start_at_the_next_batch() -> None:
    async with publishing(1, 2, 3) as publisher:
        sub = subscriber(publisher)
        await sub.receive(frames(0, 1))
        await sub.receive(frames(1, 2))
        sub.index.clear_pod("pod", TrustReason.PROCESS_RESTART)  # what KVTrustMonitor does
        assert sub.index.num_blocks("pod") == 0
        await sub.receive(frames(2, 3))  # in sequence, but the batches before it are learnt again
        assert sub.index.num_blocks("pod") == 3
        assert sub.stats.gaps == 0 and sub.stats.restarts == 0
