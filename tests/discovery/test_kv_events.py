"""KV events of discovered pods, against the in-test API server and real ZMQ publishers on loopback: where
a pod publishes (annotations over ``pool.kubernetes.kv_events``), subscribers that start and stop with the
membership, blocks dropped with the pod, bad annotations reported without stopping discovery, and nothing
left behind after many joins and leaves."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from slorouter.discovery.kv_events import (
    PORT_ANNOTATION,
    REPLAY_PORT_ANNOTATION,
    TOPIC_ANNOTATION,
    KVEventsSettingError,
    PodPublisher,
    pod_publisher,
)
from slorouter.discovery.objects import parse_pod
from slorouter.discovery.start import KubernetesDiscovery, start_discovery
from slorouter.kvevents.publisher import ZmqEventPublisher
from slorouter.kvevents.wire import BlockStored
from slorouter.metrics import DiscoveryMetrics
from slorouter.pool.config import PodKVEventsConfig, PoolConfig
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_subscriber import KVSubscriberSet, PublisherAddress
from slorouter.pool.state import PoolState
from tests.discovery.conftest import discovery_config, eventually
from tests.helpers.kube_apiserver import FakeKubeApiServer, pod


def stored(*hashes: int) -> BlockStored:
    return BlockStored(list(hashes), None, [], 16, None, "GPU", None)


def annotated(obj: dict[str, Any], **annotations: str) -> dict[str, Any]:
    """``obj`` with ``slorouter.io/<key with - for _>`` annotations."""
    obj["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": "{}",  # not ours: not kept
        **{f"slorouter.io/{key.replace('_', '-')}": value for key, value in annotations.items()},
    }
    return obj


def port_of(endpoint: str) -> str:
    return endpoint.rsplit(":", 1)[1]


async def publisher_on(host: str = "127.0.0.1", topic: str = "kv@pod@m") -> ZmqEventPublisher:
    publisher = ZmqEventPublisher(f"tcp://{host}:*", f"tcp://{host}:*", topic=topic)
    publisher.start()
    return publisher


def kv_annotations(publisher: ZmqEventPublisher) -> dict[str, str]:
    assert publisher.replay_endpoint is not None
    return {
        "kv_events_port": port_of(publisher.endpoint),
        "kv_events_replay_port": port_of(publisher.replay_endpoint),
    }


def subscriber_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "KVEventSubscriber.run"]  # type: ignore[union-attr]


class Running:
    def __init__(
        self, pool: PoolState, index: KVBlockIndex, handle: KubernetesDiscovery, registry: Any
    ) -> None:
        self.pool = pool
        self.index = index
        self.handle = handle
        self.registry = registry

    @property
    def subscribers(self) -> KVSubscriberSet:
        assert self.handle.watcher.kv is not None
        return self.handle.watcher.kv.subscribers

    def publisher_of(self, address: str) -> PublisherAddress | None:
        subscription = self.subscribers.subscriptions.get(address)
        return None if subscription is None else subscription.publisher

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else float(value)


@pytest.fixture
async def discover(kubeconfig: Path) -> AsyncIterator[Any]:
    handles: list[KubernetesDiscovery] = []

    async def start(**fields: Any) -> Running:
        pool, index, registry = PoolState(), KVBlockIndex(), CollectorRegistry()
        config = PoolConfig(
            kubernetes=discovery_config(kubeconfig, **fields),
            kv_events_replay_timeout_ms=300,
            kv_events_reconnect_ms=50,
        )
        handle = await start_discovery(config, pool, kv_index=index, observer=DiscoveryMetrics(registry))
        assert isinstance(handle, KubernetesDiscovery)
        handles.append(handle)
        return Running(pool, index, handle, registry)

    yield start
    for handle in handles:
        await handle.stop()


SELECTOR: dict[str, Any] = {"label_selector": {"app": "vllm"}, "target_ports": [8000]}


# --- where a pod publishes ---------------------------------------------------------------------------------
def view(**annotations: str) -> Any:
    obj = annotated(pod("a", "10.0.0.1"), **annotations)
    obj["metadata"]["resourceVersion"] = "1"
    return parse_pod(obj)


def test_annotations_override_the_config_one_setting_at_a_time():
    config = PodKVEventsConfig(port=5557, replay_port=5558, topic="kv@")
    assert pod_publisher(view(), config, [8000]) == PodPublisher(5557, 5558, "kv@")
    assert pod_publisher(view(kv_events_port="6000"), config, [8000]) == PodPublisher(6000, 5558, "kv@")
    assert pod_publisher(view(kv_events_replay_port="off"), config, [8000]) == PodPublisher(5557, None, "kv@")
    assert pod_publisher(view(kv_events_topic="kv@a"), config, [8000]) == PodPublisher(5557, 5558, "kv@a")
    assert pod_publisher(view(kv_events_port="OFF"), config, [8000]) is None  # opted out
    # Without the config, only annotated pods publish.
    assert pod_publisher(view(), None, [8000]) is None
    assert pod_publisher(view(kv_events_port=" 7000 "), None, [8000]) == PodPublisher(7000, None, "")
    assert PodKVEventsConfig() == PodKVEventsConfig(port=5557, replay_port=None, topic="")  # vLLM's default


def test_each_target_port_reads_its_own_publisher_port_and_ipv6_is_bracketed():
    publisher = pod_publisher(view(kv_events_port="5557", kv_events_replay_port="6557"), None, [8000, 8001])
    assert publisher is not None
    assert publisher.address("10.0.0.1", 1) == PublisherAddress(
        "tcp://10.0.0.1:5558", "tcp://10.0.0.1:6558", ""
    )
    assert publisher.address("fd00::1", 0) == PublisherAddress(
        "tcp://[fd00::1]:5557", "tcp://[fd00::1]:6557", ""
    )


PORT, REPLAY, TOPIC = PORT_ANNOTATION, REPLAY_PORT_ANNOTATION, TOPIC_ANNOTATION


@pytest.mark.parametrize(
    ("annotations", "ports", "source", "message"),
    [
        ({PORT: "http"}, [8000], PORT, "slorouter.io/kv-events-port='http' is not a port"),
        ({PORT: "70000"}, [8000], PORT, "is not a port (1-65535) or 'off'"),
        ({PORT: "-1"}, [8000], PORT, "is not a port"),
        ({PORT: "5557", REPLAY: "x"}, [8000], REPLAY, "slorouter.io/kv-events-replay-port='x' is not a port"),
        (
            {PORT: "8000"},
            [8000],
            PORT,
            "KV-event port 8000 (slorouter.io/kv-events-port) is also a target port",
        ),
        ({PORT: "5557", REPLAY: "5557"}, [8000], REPLAY, "replay port 5557"),
        ({PORT: "5557", REPLAY: "5558"}, [8000, 8001], REPLAY, "is also the KV-event port"),
        ({PORT: "65535"}, [8000, 8001], PORT, "65535 + 1 (one per target port) exceeds 65535"),
        ({TOPIC: "kv@"}, [8000], TOPIC, "no KV-event port is known: set slorouter.io/kv-events-port"),
    ],
)
def test_unusable_settings_name_the_annotation(annotations, ports, source, message):
    keys = {key.removeprefix("slorouter.io/").replace("-", "_"): value for key, value in annotations.items()}
    with pytest.raises(KVEventsSettingError) as info:
        pod_publisher(view(**keys), None, ports)
    assert info.value.source == source and message in str(info.value)


def test_only_our_annotations_are_kept():
    meta = view(kv_events_port="1").meta
    assert meta.annotations == {PORT_ANNOTATION: "1"}


# --- subscribers that follow the membership ----------------------------------------------------------------
async def test_a_discovered_pods_events_reach_the_index_and_leave_with_the_pod(apiserver, discover):
    publisher = await publisher_on()
    try:
        publisher.publish([stored(1, 2)], 0.0)  # before the router: only the replay buffer has it
        apiserver.create("pods", annotated(pod("a", "127.0.0.1"), **kv_annotations(publisher)))
        run = await discover(**SELECTOR)
        address = "127.0.0.1:8000"
        assert run.publisher_of(address) == PublisherAddress(
            publisher.endpoint, publisher.replay_endpoint, ""
        )
        await eventually(lambda: run.index.num_blocks(address) == 2, what="replayed at joining")
        await asyncio.sleep(0.2)  # the SUB socket connects
        publisher.publish([stored(3)], 0.0)
        await eventually(lambda: run.index.match([1, 2, 3], [address]) == {address: 3}, what="live batch")
        assert run.index.pod_stats(address).gaps == 0
        assert run.metric("slorouter_discovery_kv_event_subscriptions") == 1

        apiserver.delete("pods", "default", "a")
        await eventually(lambda: len(run.pool) == 0, what="a left")
        assert len(run.subscribers) == 0 and address not in run.index.addresses
        assert run.index.match([1], [address]) == {address: 0} and run.index.distinct_blocks == 0
        await eventually(lambda: not subscriber_tasks(), what="the subscriber's task ended")
        publisher.publish([stored(4)], 0.0)  # nobody listens any more
        await asyncio.sleep(0.1)
        assert run.index.distinct_blocks == 0
        assert run.metric("slorouter_discovery_kv_event_subscriptions") == 0
    finally:
        await publisher.close()


async def test_an_ip_change_moves_the_subscription_and_drops_the_old_blocks(apiserver, discover):
    first, second = await publisher_on("127.0.0.1"), await publisher_on("127.0.0.2")
    try:
        first.publish([stored(1)], 0.0)
        second.publish([stored(2)], 0.0)
        apiserver.create("pods", annotated(pod("a", "127.0.0.1"), **kv_annotations(first)))
        run = await discover(**SELECTOR)
        await eventually(lambda: run.index.num_blocks("127.0.0.1:8000") == 1)
        apiserver.update("pods", annotated(pod("a", "127.0.0.2"), **kv_annotations(second)))
        await eventually(lambda: run.index.num_blocks("127.0.0.2:8000") == 1, what="moved")
        assert run.index.addresses == {"127.0.0.2:8000"}
        assert run.index.match([1], ["127.0.0.1:8000", "127.0.0.2:8000"]) == {
            "127.0.0.1:8000": 0,
            "127.0.0.2:8000": 0,
        }
        assert run.index.match([2], ["127.0.0.2:8000"]) == {"127.0.0.2:8000": 1}
        await eventually(lambda: len(subscriber_tasks()) == 1)
    finally:
        await first.close()
        await second.close()


async def test_a_new_annotation_restarts_the_subscription_and_an_unchanged_pod_keeps_it(apiserver, discover):
    first, second = await publisher_on(), await publisher_on()
    try:
        first.publish([stored(1)], 0.0)
        second.publish([stored(2)], 0.0)
        apiserver.create("pods", annotated(pod("a", "127.0.0.1"), **kv_annotations(first)))
        run = await discover(**SELECTOR)
        address = "127.0.0.1:8000"
        await eventually(lambda: run.index.num_blocks(address) == 1)
        kept = run.subscribers.subscriber(address)
        # A label change re-adds the endpoint; its pod and publisher are the same: the subscriber stays.
        relabelled = annotated(
            pod("a", "127.0.0.1", labels={"app": "vllm", "x": "y"}), **kv_annotations(first)
        )
        apiserver.update("pods", relabelled)
        await eventually(lambda: run.pool.get(address) is not None and "x" in run.pool.get(address).labels)
        assert run.subscribers.subscriber(address) is kept and run.index.num_blocks(address) == 1
        # Another port: the old publisher's blocks go, the new one's come.
        apiserver.update("pods", annotated(pod("a", "127.0.0.1"), **kv_annotations(second)))
        await eventually(lambda: run.index.match([2], [address]) == {address: 1}, what="second publisher")
        assert run.index.match([1], [address]) == {address: 0}
        # Opted out: no subscription, no blocks; the endpoint stays.
        apiserver.update("pods", annotated(pod("a", "127.0.0.1"), kv_events_port="off"))
        await eventually(lambda: len(run.subscribers) == 0)
        assert address in run.pool and run.index.num_blocks(address) == 0
    finally:
        await first.close()
        await second.close()


async def test_the_config_serves_every_pod_and_annotations_win(apiserver, discover):
    apiserver.create("pods", pod("plain", "10.0.0.1"))
    apiserver.create(
        "pods", annotated(pod("own-port", "10.0.0.2"), kv_events_port="6000", kv_events_topic="t")
    )
    apiserver.create("pods", annotated(pod("opted-out", "10.0.0.3"), kv_events_port="off"))
    apiserver.create("pods", annotated(pod("no-replay", "10.0.0.4"), kv_events_replay_port="off"))
    run = await discover(**SELECTOR, kv_events={"port": 5557, "replay_port": 5558, "topic": "kv@"})
    assert len(run.pool) == 4
    assert run.subscribers.subscriptions.keys() == {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.4:8000"}
    assert run.publisher_of("10.0.0.1:8000") == PublisherAddress(
        "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558", "kv@"
    )
    assert run.publisher_of("10.0.0.2:8000") == PublisherAddress(
        "tcp://10.0.0.2:6000", "tcp://10.0.0.2:5558", "t"
    )
    assert run.publisher_of("10.0.0.4:8000") == PublisherAddress("tcp://10.0.0.4:5557", None, "kv@")


async def test_without_config_or_annotation_no_pod_is_subscribed(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(**SELECTOR)
    assert len(run.pool) == 1 and len(run.subscribers) == 0 and not subscriber_tasks()


async def test_a_pod_on_several_target_ports_subscribes_each_engine(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000, 8001], kv_events={})
    assert run.publisher_of("10.0.0.1:8000") == PublisherAddress("tcp://10.0.0.1:5557", None, "")
    assert run.publisher_of("10.0.0.1:8001") == PublisherAddress("tcp://10.0.0.1:5558", None, "")


async def test_a_bad_annotation_is_reported_once_and_discovery_goes_on(apiserver, discover, caplog):
    caplog.set_level(logging.WARNING, logger="slorouter.discovery.kv_events")
    apiserver.create("pods", annotated(pod("bad", "10.0.0.1"), kv_events_port="fifty"))
    apiserver.create("pods", pod("good", "10.0.0.2"))
    run = await discover(**SELECTOR, kv_events={})
    assert sorted(e.name for e in run.pool.endpoints) == ["bad", "good"]  # still served
    assert run.subscribers.subscriptions.keys() == {"10.0.0.2:8000"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "pod default/bad: slorouter.io/kv-events-port='fifty' is not a port (1-65535) or 'off'; "
        "it is served without KV events"
    ]
    assert run.metric("slorouter_discovery_kv_events_config_errors_total", source=PORT_ANNOTATION) == 1
    # Other changes do not repeat it; a new bad value is reported; a fixed one subscribes.
    apiserver.create("pods", pod("c", "10.0.0.3"))
    await eventually(lambda: len(run.pool) == 3)
    apiserver.update(
        "pods", annotated(pod("bad", "10.0.0.1"), kv_events_port="5557", kv_events_replay_port="5557")
    )
    await eventually(lambda: len(caplog.records) == 2)
    assert "slorouter.io/kv-events-replay-port" in caplog.records[1].getMessage()
    assert "pod default/bad" in caplog.records[1].getMessage()
    apiserver.update("pods", annotated(pod("bad", "10.0.0.1"), kv_events_port="5560"))
    await eventually(lambda: "10.0.0.1:8000" in run.subscribers.subscriptions)
    assert len(caplog.records) == 2


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts file descriptors through /proc")
async def test_many_joins_and_leaves_leave_no_task_socket_or_index_entry(apiserver, discover):
    hosts = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
    publishers = [await publisher_on(host) for host in hosts]
    try:
        for publisher in publishers:
            publisher.publish([stored(1)], 0.0)
        run = await discover(**SELECTOR)

        async def cycle(i: int) -> None:
            host = hosts[i % 3]
            address = f"{host}:8000"
            annotations = kv_annotations(publishers[i % 3])
            apiserver.create("pods", annotated(pod(f"p{i}", host), **annotations))
            await eventually(lambda: run.index.num_blocks(address) == 1, what=f"p{i} joined")
            if i % 2:
                apiserver.update("pods", annotated(pod(f"p{i}", host, ready=False), **annotations))
                await eventually(lambda: len(run.pool) == 0, what=f"p{i} not ready")
            apiserver.delete("pods", "default", f"p{i}")
            await eventually(lambda: len(run.pool) == 0 and not run.index.addresses, what=f"p{i} left")

        await cycle(0)  # the ZMQ context's own descriptors are open from here on
        await eventually(lambda: not subscriber_tasks())
        baseline = open_fds()
        for i in range(1, 41):
            await cycle(i)
        await eventually(lambda: not subscriber_tasks() and run.subscribers.stopping == 0, what="tasks ended")
        await eventually(lambda: open_fds() <= baseline, what=f"descriptors back to {baseline}")
        assert run.index.addresses == frozenset() and run.index.distinct_blocks == 0
        assert run.index.speculative_claims == 0
        assert run.metric("slorouter_discovery_endpoint_changes_total", change="added") == 41
        assert run.metric("slorouter_discovery_endpoint_changes_total", change="removed") == 41
    finally:
        for publisher in publishers:
            await publisher.close()


async def test_stopping_discovery_stops_every_subscriber(apiserver, kubeconfig):
    apiserver.create("pods", annotated(pod("a", "10.0.0.1"), kv_events_port="5557"))
    apiserver.create("pods", annotated(pod("b", "10.0.0.2"), kv_events_port="5557"))
    index = KVBlockIndex()
    config = PoolConfig(kubernetes=discovery_config(kubeconfig, **SELECTOR))
    handle = await start_discovery(config, PoolState(), kv_index=index)
    assert len(subscriber_tasks()) == 2
    await handle.stop()
    assert not subscriber_tasks() and index.addresses == frozenset()


async def test_without_an_index_discovery_subscribes_nothing(apiserver: FakeKubeApiServer, kubeconfig):
    apiserver.create("pods", annotated(pod("a", "10.0.0.1"), kv_events_port="5557"))
    handle = await start_discovery(
        PoolConfig(kubernetes=discovery_config(kubeconfig, **SELECTOR)), PoolState()
    )
    assert isinstance(handle, KubernetesDiscovery) and handle.watcher.kv is None
    assert not subscriber_tasks()
    await handle.stop()
