"""KVEventSubscriber over real ZMQ on 127.0.0.1: delivery, gaps replayed, restarts, malformed input."""

from __future__ import annotations

import asyncio
import socket

import pytest
import zmq
import zmq.asyncio

from slorouter.kvevents.publisher import ZmqEventPublisher
from slorouter.kvevents.wire import BlockStored, KVEventBatch, encode_batch, seq_frame
from slorouter.pool.config import PoolConfig
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_subscriber import (
    KVEventSubscriber,
    KVSubscriberSet,
    PublisherAddress,
    Subscription,
    subscribers_from_config,
)


def stored(*hashes: int) -> BlockStored:
    return BlockStored(list(hashes), None, [], 16, None, "GPU", None)


def frames(seq: int, *hashes: int) -> list[bytes]:
    return [b"kv", seq_frame(seq), encode_batch(KVEventBatch(0.0, [stored(*hashes)]))]


async def started(**kwargs: object) -> ZmqEventPublisher:
    publisher = ZmqEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv@pod@m", **kwargs)  # type: ignore[arg-type]
    publisher.start()
    return publisher


def subscriber_of(
    publisher: ZmqEventPublisher, index: KVBlockIndex, replay: bool = True
) -> KVEventSubscriber:
    address = PublisherAddress(publisher.endpoint, publisher.replay_endpoint if replay else None, "kv@")
    return KVEventSubscriber("pod", address, index, replay_timeout_s=0.5, reconnect_s=0.05)


async def wait_for(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_published_batches_reach_the_index_and_a_late_joiner_replays_from_zero() -> None:
    publisher = await started()
    index = KVBlockIndex()
    try:
        publisher.publish([stored(1)], 0.0)  # before anyone subscribed: lost on PUB, kept for replay
        subscriber = subscriber_of(publisher, index)
        subscriber.start()
        await asyncio.sleep(0.2)  # the SUB socket connects
        publisher.publish([stored(2)], 0.0)
        await wait_for(lambda: index.num_blocks("pod") == 2)
        assert index.match([1, 2], ["pod"]) == {"pod": 2}
        stats = index.pod_stats("pod")
        assert stats.batches == 2 and stats.gaps == 0
        await subscriber.stop()
    finally:
        await publisher.close()


async def test_a_subscriber_joining_a_quiet_publisher_replays_its_buffer_at_once() -> None:
    publisher = await started()
    index = KVBlockIndex()
    try:
        publisher.publish([stored(1)], 0.0)
        publisher.publish([stored(2)], 0.0)  # and then nothing more
        subscriber = subscriber_of(publisher, index)
        subscriber.start()
        await wait_for(lambda: index.num_blocks("pod") == 2)
        publisher.publish([stored(3)], 0.0)
        await wait_for(lambda: index.num_blocks("pod") == 3)
        stats = index.pod_stats("pod")
        assert (stats.gaps, stats.restarts, stats.unrecovered) == (0, 0, 0)
        await subscriber.stop()
    finally:
        await publisher.close()


async def test_batches_both_replayed_and_published_at_joining_are_applied_once() -> None:
    publisher = await started()
    index = KVBlockIndex()
    subscriber = subscriber_of(publisher, index)
    try:
        for k in range(3):
            publisher.publish([stored(10 + k)], 0.0)
        await subscriber._join()
        await subscriber.receive(frames(1, 11))  # the PUB copies of what the replay gave
        await subscriber.receive(frames(2, 12))
        await subscriber.receive(frames(3, 13))
        stats = index.pod_stats("pod")
        assert (stats.batches, stats.restarts, stats.gaps) == (4, 0, 0)
        assert index.match([10, 11, 12, 13], ["pod"]) == {"pod": 4}
        await subscriber.receive(frames(0, 20))  # a newer batch ended the joining window: a restart again
        assert index.pod_stats("pod").restarts == 1
    finally:
        await publisher.close()


async def test_a_batch_the_sub_socket_missed_and_nothing_followed_is_fetched_once_settled() -> None:
    # The SUB socket listens to a publisher that never sends: what the real one publishes after the join
    # replay reaches the subscriber only through the replay socket, as a batch published before the
    # subscription reached the publisher does.
    publisher = await started()
    silent = zmq.asyncio.Context.instance().socket(zmq.PUB)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind("tcp://127.0.0.1:*")
    index = KVBlockIndex()
    endpoint = silent.getsockopt(zmq.LAST_ENDPOINT).decode()
    address = PublisherAddress(endpoint, publisher.replay_endpoint, "kv@")
    subscriber = KVEventSubscriber("pod", address, index, replay_timeout_s=0.5, reconnect_s=0.05)
    replays: list[int] = []
    replay = subscriber._replay

    async def counted(start: int, upto: int):  # type: ignore[no-untyped-def]
        replays.append(start)
        return await replay(start, upto)

    subscriber._replay = counted  # type: ignore[method-assign]
    try:
        subscriber.start()
        await wait_for(lambda: replays == [0])  # joined: the buffer was empty
        publisher.publish([stored(1)], 0.0)
        publisher.publish([stored(2)], 0.0)
        await wait_for(lambda: index.num_blocks("pod") == 2)
        assert replays == [0, 0]
        publisher.publish([stored(3)], 0.0)
        await asyncio.sleep(0.7)  # past another settling time: asked once per connection, not again
        assert replays == [0, 0] and index.num_blocks("pod") == 2
        assert index.pod_stats("pod").unrecovered == 0
        await subscriber.stop()
    finally:
        silent.close(linger=0)
        await publisher.close()


async def test_a_gap_is_recovered_through_the_replay_socket() -> None:
    publisher = await started()
    index = KVBlockIndex()
    subscriber = subscriber_of(publisher, index)
    try:
        for k in range(3):
            publisher.publish([stored(10 + k)], 0.0)
        await subscriber.receive(frames(0, 10))
        await subscriber.receive(frames(2, 12))  # 1 was missed
        stats = index.pod_stats("pod")
        assert (stats.gaps, stats.replays, stats.unrecovered) == (1, 1, 0)
        assert index.num_blocks("pod") == 3
    finally:
        await publisher.close()


async def test_a_gap_the_buffer_no_longer_covers_clears_the_pod() -> None:
    publisher = await started(buffer_steps=1)
    index = KVBlockIndex()
    subscriber = subscriber_of(publisher, index)
    try:
        for k in range(3):
            publisher.publish([stored(10 + k)], 0.0)
        await subscriber.receive(frames(0, 10))
        await subscriber.receive(frames(2, 12))
        stats = index.pod_stats("pod")
        assert (stats.gaps, stats.replays, stats.unrecovered) == (1, 0, 1)
        assert index.match([10], ["pod"]) == {"pod": 0}  # cleared: it may have missed removals
        assert index.match([12], ["pod"]) == {"pod": 1}  # then the new batch
    finally:
        await publisher.close()


async def test_without_a_replay_endpoint_a_gap_clears_the_pod() -> None:
    publisher = await started()
    index = KVBlockIndex()
    subscriber = subscriber_of(publisher, index, replay=False)
    try:
        await subscriber.receive(frames(0, 1))
        await subscriber.receive(frames(5, 2))
        assert index.pod_stats("pod").unrecovered == 1
        assert index.match([1], ["pod"]) == {"pod": 0}
    finally:
        await publisher.close()


async def test_a_sequence_that_goes_back_is_a_restart() -> None:
    index = KVBlockIndex()
    subscriber = KVEventSubscriber("pod", PublisherAddress("tcp://127.0.0.1:1"), index)
    await subscriber.receive(frames(0, 1))
    await subscriber.receive(frames(1, 2))
    await subscriber.receive(frames(0, 3))
    assert index.pod_stats("pod").restarts == 1
    assert index.match([1], ["pod"]) == {"pod": 0}
    assert index.match([3], ["pod"]) == {"pod": 1}


@pytest.mark.parametrize(
    "bad",
    [
        [b"kv", seq_frame(1)],
        [b"kv", b"\x01", b"payload"],
        [b"kv", seq_frame(1), b"\xc1garbage"],
        [b"kv", seq_frame(1), encode_batch(KVEventBatch(0.0, []))[:-2] + b"\x01\xc0"],  # events: 1
    ],
)
async def test_malformed_messages_are_counted_and_never_stop_the_subscriber(bad: list[bytes]) -> None:
    index = KVBlockIndex()
    subscriber = KVEventSubscriber("pod", PublisherAddress("tcp://127.0.0.1:1"), index)
    await subscriber.receive(frames(0, 1))
    await subscriber.receive(bad)
    assert index.pod_stats("pod").decode_errors == 1
    assert index.num_blocks("pod") == 0  # what it missed is unknown: cleared
    await subscriber.receive(frames(1, 2))
    assert index.match([2], ["pod"]) == {"pod": 1}


async def test_a_session_failure_reconnects() -> None:
    index = KVBlockIndex()
    subscriber = KVEventSubscriber("pod", PublisherAddress("tcp://bad host:1"), index, reconnect_s=0.01)
    subscriber.start()
    await wait_for(lambda: index.pod_stats("pod").reconnects >= 2)
    await subscriber.stop()


def test_subscribers_from_config() -> None:
    config = PoolConfig.model_validate(
        {
            "endpoints": [
                "10.0.0.1:8000",
                {
                    "address": "10.0.0.2:8000",
                    "kv_events": {
                        "endpoint": "tcp://10.0.0.2:5557",
                        "replay_endpoint": "tcp://10.0.0.2:5558",
                    },
                },
            ],
            "kv_events_replay_timeout_ms": 250,
        }
    )
    (subscriber,) = subscribers_from_config(config, KVBlockIndex())
    assert subscriber.address == "10.0.0.2:8000"
    assert subscriber.publisher == PublisherAddress("tcp://10.0.0.2:5557", "tcp://10.0.0.2:5558", "")
    assert subscriber.replay_timeout_s == 0.25


@pytest.mark.parametrize("endpoint", ["10.0.0.2:5557", "http://x:1", "tcp://nohost", "tcp://"])
def test_bad_publisher_addresses_are_config_errors(endpoint: str) -> None:
    with pytest.raises(ValueError, match=r"ZMQ address|port|host"):
        PoolConfig.model_validate({"endpoints": [{"address": "a:1", "kv_events": {"endpoint": endpoint}}]})


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")
async def test_a_publisher_at_an_ipv6_address_is_reached() -> None:
    pub = zmq.asyncio.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.IPV6, 1)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://[::1]:*")
    index = KVBlockIndex()
    subscriber = KVEventSubscriber("[::1]:8000", PublisherAddress(pub.last_endpoint.decode()), index)
    try:
        subscriber.start()

        async def delivered() -> bool:
            await pub.send_multipart(frames(0, 1))
            await asyncio.sleep(0.05)
            return index.num_blocks("[::1]:8000") == 1

        deadline = asyncio.get_running_loop().time() + 5
        while not await delivered():
            assert asyncio.get_running_loop().time() < deadline, "nothing arrived over IPv6"
    finally:
        await subscriber.stop()
        pub.close(linger=0)


async def test_a_subscriber_set_follows_its_desired_mapping() -> None:
    publisher = await started()
    index = KVBlockIndex()
    subscribers = KVSubscriberSet(index, replay_timeout_s=0.5, reconnect_s=0.05)
    here = Subscription("pod-a", PublisherAddress(publisher.endpoint, publisher.replay_endpoint, ""))
    try:
        publisher.publish([stored(1)], 0.0)
        assert subscribers.update({"a": here}) == (["a"], [])
        await wait_for(lambda: index.num_blocks("a") == 1)
        assert subscribers.update({"a": here}) == ([], [])  # unchanged: kept
        # Another pod at the same address: a new subscriber, and the old one's blocks are gone first.
        moved = Subscription("pod-b", here.publisher)
        assert subscribers.update({"a": moved}) == (["a"], ["a"])
        assert index.pod_stats("a").batches == 0
        await wait_for(lambda: index.num_blocks("a") == 1)  # the new one replays from 0
        await subscribers.stop()
        assert len(subscribers) == 0 and subscribers.stopping == 0 and index.addresses == frozenset()
    finally:
        await subscribers.stop()
        await publisher.close()
