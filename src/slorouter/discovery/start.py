"""``start_discovery``: what a front-end's assembly calls to keep its pool's membership up to date."""

from __future__ import annotations

import logging
from typing import Protocol

from slorouter.discovery.kube_api import KubeApi, KubernetesConfigError
from slorouter.discovery.kv_events import PodKVSubscriptions
from slorouter.discovery.observer import DiscoveryObserver
from slorouter.discovery.watcher import PoolWatcher
from slorouter.pool.config import PoolConfig
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_subscriber import KVSubscriberSet
from slorouter.pool.state import PoolState

log = logging.getLogger(__name__)

__all__ = ["DiscoveryHandle", "KubernetesConfigError", "start_discovery"]


class DiscoveryHandle(Protocol):
    async def stop(self) -> None: ...


class StaticMembership:
    """``pool.endpoints``: the pool was filled from the config and does not change."""

    async def stop(self) -> None:
        return None


class KubernetesDiscovery:
    def __init__(self, api: KubeApi, watcher: PoolWatcher) -> None:
        self.api = api
        self.watcher = watcher

    async def stop(self) -> None:
        await self.watcher.stop()
        await self.api.close()


async def start_discovery(
    config: PoolConfig,
    pool: PoolState,
    *,
    kv_index: KVBlockIndex | None = None,
    observer: DiscoveryObserver | None = None,
) -> DiscoveryHandle:
    """Start following ``config.kubernetes`` (a no-op for static endpoints) and wait, at most
    ``initial_sync_timeout_s``, for the first list, so that serving starts with the pods that are Ready.
    With ``kv_index``, the discovered pods that publish KV events (their annotations, else
    ``kubernetes.kv_events``) are subscribed and feed it. What happens is reported to ``observer``
    (``slorouter.metrics.DiscoveryMetrics``: discovery's Prometheus series).

    Raises ``KubernetesConfigError`` when the credentials cannot be loaded; an unreachable API server is
    not an error: the pool stays empty and discovery keeps retrying.
    """
    kubernetes = config.kubernetes
    if kubernetes is None:
        return StaticMembership()
    api = await KubeApi.connect(kubernetes)
    kv = None
    if kv_index is not None:
        subscribers = KVSubscriberSet(
            kv_index,
            replay_timeout_s=config.kv_events_replay_timeout_ms / 1000,
            reconnect_s=config.kv_events_reconnect_ms / 1000,
        )
        kv = PodKVSubscriptions(kubernetes.kv_events, subscribers, pool, observer)
    watcher = PoolWatcher(kubernetes, pool, api, observer=observer, kv=kv)
    watcher.start()
    if not await watcher.wait_synced(kubernetes.initial_sync_timeout_s):
        log.warning(
            "no answer from the Kubernetes API server within %.0f s: serving with an empty pool while "
            "discovery keeps trying",
            kubernetes.initial_sync_timeout_s,
        )
    return KubernetesDiscovery(api, watcher)
