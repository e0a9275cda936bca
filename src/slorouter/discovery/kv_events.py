"""KV-event subscriptions of discovered pods, for the precise prefix plugins.

Where a pod publishes vLLM's KV events comes from, per setting, its annotation, else
``pool.kubernetes.kv_events``, else nowhere (the pod is not subscribed):

- ``slorouter.io/kv-events-port``: the PUB socket's port on the pod's IP, or ``off`` (not subscribed, whatever
  the config says);
- ``slorouter.io/kv-events-replay-port``: the replay ROUTER socket's port, or ``off`` (no replay);
- ``slorouter.io/kv-events-topic``: the SUB prefix filter.

A pod with several target ports runs one engine per port: the ``i``-th target port's events are read from
``port + i`` (and ``replay_port + i``), as vLLM offsets its publisher's port by the data-parallel rank. An
annotation that cannot be used is reported once per pod and value (a warning naming the pod and the
annotation, ``slorouter_discovery_kv_events_config_errors_total``); that pod is then served without KV
events, and discovery goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slorouter.discovery.objects import PodView
from slorouter.discovery.observer import DiscoveryObserver
from slorouter.pool.config import PodKVEventsConfig
from slorouter.pool.kv_subscriber import KVSubscriberSet, PublisherAddress, Subscription
from slorouter.pool.state import Endpoint, PoolState

log = logging.getLogger(__name__)

PORT_ANNOTATION = "slorouter.io/kv-events-port"
REPLAY_PORT_ANNOTATION = "slorouter.io/kv-events-replay-port"
TOPIC_ANNOTATION = "slorouter.io/kv-events-topic"
ANNOTATIONS = (PORT_ANNOTATION, REPLAY_PORT_ANNOTATION, TOPIC_ANNOTATION)
OFF = "off"
CONFIG_SOURCE = "pool.kubernetes.kv_events"


class KVEventsSettingError(ValueError):
    """A pod's KV-event settings that cannot be used; ``source`` is the annotation at fault (or the config
    section, when only the pod's target ports make it unusable)."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(message)
        self.source = source


@dataclass(frozen=True, slots=True)
class PodPublisher:
    """Where a pod's first engine publishes; the ``i``-th target port's engine is ``i`` ports further."""

    port: int
    replay_port: int | None
    topic: str

    def address(self, ip: str, offset: int) -> PublisherAddress:
        host = f"[{ip}]" if ":" in ip else ip
        replay = None if self.replay_port is None else f"tcp://{host}:{self.replay_port + offset}"
        return PublisherAddress(f"tcp://{host}:{self.port + offset}", replay, self.topic)


def _port(text: str, annotation: str) -> int | None:
    value = text.strip()
    if value.lower() == OFF:
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= 65535:
        raise KVEventsSettingError(annotation, f"{annotation}={text!r} is not a port (1-65535) or {OFF!r}")
    return int(value)


def pod_publisher(
    pod: PodView, config: PodKVEventsConfig | None, ports: Sequence[int]
) -> PodPublisher | None:
    """The pod's publisher (None: not subscribed); raises ``KVEventsSettingError``."""
    annotations = pod.meta.annotations
    port_text = annotations.get(PORT_ANNOTATION)
    replay_text = annotations.get(REPLAY_PORT_ANNOTATION)
    if port_text is not None:
        port, port_source = _port(port_text, PORT_ANNOTATION), PORT_ANNOTATION
        if port is None:
            return None
    elif config is not None:
        port, port_source = config.port, CONFIG_SOURCE
    else:
        for annotation in (REPLAY_PORT_ANNOTATION, TOPIC_ANNOTATION):
            if annotation in annotations:
                raise KVEventsSettingError(
                    annotation,
                    f"{annotation} is set but no KV-event port is known: set {PORT_ANNOTATION} "
                    f"(or {CONFIG_SOURCE})",
                )
        return None
    if replay_text is not None:
        replay, replay_source = _port(replay_text, REPLAY_PORT_ANNOTATION), REPLAY_PORT_ANNOTATION
    else:
        replay, replay_source = (config.replay_port if config else None), CONFIG_SOURCE
    topic = annotations.get(TOPIC_ANNOTATION, config.topic if config else "")
    publisher = PodPublisher(port, replay, topic)
    _check_ports(publisher, ports, port_source, replay_source)
    return publisher


def _check_ports(publisher: PodPublisher, ports: Sequence[int], port_source: str, replay_source: str) -> None:
    """Every engine's ports exist and collide neither with each other nor with the model-server ports."""
    count = max(1, len(ports))
    spans = [(publisher.port, port_source, "port")]
    if publisher.replay_port is not None:
        spans.append((publisher.replay_port, replay_source, "replay port"))
    taken: dict[int, str] = {port: "a target port" for port in ports}
    for first, source, what in spans:
        last = first + count - 1
        if last > 65535:
            raise KVEventsSettingError(
                source, f"KV-event {what} {first} + {count - 1} (one per target port) exceeds 65535"
            )
        for number in range(first, last + 1):
            if number in taken:
                raise KVEventsSettingError(
                    source, f"KV-event {what} {number} ({source}) is also {taken[number]} of the pod"
                )
            taken[number] = f"the KV-event {what}"


class PodKVSubscriptions:
    """Keeps one subscriber per discovered endpoint whose pod publishes, in step with the membership."""

    def __init__(
        self,
        config: PodKVEventsConfig | None,
        subscribers: KVSubscriberSet,
        pool: PoolState,
        observer: DiscoveryObserver | None = None,
    ) -> None:
        self.config = config
        self.subscribers = subscribers
        self.pool = pool
        self.observer = observer or DiscoveryObserver()
        self._reported: dict[str, str] = {}  # pod name → the problem last reported for it

    def sync(self, pods: Iterable[PodView], ports: Sequence[int], owned: Mapping[str, Endpoint]) -> None:
        """Subscribe the endpoints in ``owned`` whose pod publishes; stop the others' subscribers."""
        desired: dict[str, Subscription] = {}
        reported: dict[str, str] = {}
        for pod in pods:
            if not pod.serving:
                continue
            try:
                publisher = pod_publisher(pod, self.config, ports)
            except KVEventsSettingError as exc:
                reported[pod.name] = problem = str(exc)
                if self._reported.get(pod.name) != problem:
                    log.warning(
                        "pod %s/%s: %s; it is served without KV events",
                        pod.meta.namespace,
                        pod.name,
                        problem,
                    )
                    self.observer.kv_events_config_error(exc.source)
                continue
            if publisher is None:
                continue
            assert pod.ip is not None
            for offset, port in enumerate(ports):
                address = pod.address(port)
                endpoint = owned.get(address)
                if endpoint is not None and endpoint.name == pod.name:
                    desired[address] = Subscription(pod.name, publisher.address(pod.ip, offset))
        self._reported = reported
        self.subscribers.update(desired)
        self._prune()
        self.observer.kv_event_subscriptions(len(self.subscribers))

    def clear(self) -> None:
        self._reported = {}
        self.subscribers.update({})
        self._prune()
        self.observer.kv_event_subscriptions(0)

    def _prune(self) -> None:
        """Drop the index entries of endpoints no longer in the pool (a subscriber's were dropped with it;
        this takes those the scorers made, e.g. a speculative claim made as the endpoint left)."""
        index = self.subscribers.index
        for address in index.addresses:
            if address not in self.pool:
                index.remove_pod(address)

    async def stop(self) -> None:
        await self.subscribers.stop()
