"""Follows an InferencePool (or a fixed label selector) and its pods, and keeps the pool's membership equal
to the serving pods × the target ports.

With an InferencePool, one reflector watches the pool object itself; when its selector changes, the pod
reflector is replaced by one for the new selector (whose first list then brings the membership in line),
and when its target ports change, the membership is recomputed from the pods already known. A deleted (or
not yet created) InferencePool leaves the pool empty until it exists again.

With ``kv`` (``PodKVSubscriptions``), every membership change also brings the KV-event subscribers in line:
an endpoint that joins is subscribed if its pod publishes, one that leaves (or whose pod changes its IP,
its annotations or its identity) has its subscriber stopped and its blocks dropped from the index.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from slorouter.discovery.kv_events import PodKVSubscriptions
from slorouter.discovery.membership import Membership
from slorouter.discovery.objects import InferencePoolSpec, PodView, parse_inference_pool, parse_pod
from slorouter.discovery.observer import DiscoveryObserver
from slorouter.discovery.reflector import Backoff, Reflector
from slorouter.discovery.source import ResourceSource
from slorouter.pool.config import KubernetesPoolConfig
from slorouter.pool.state import PoolState

log = logging.getLogger(__name__)
POD_STATES = ("serving", "not_ready", "pending", "terminating")


class SourceFactory(Protocol):
    def pods(self, namespace: str, match_labels: dict[str, str]) -> ResourceSource: ...

    def inference_pool(self, namespace: str, name: str) -> ResourceSource: ...


class PoolWatcher:
    """Discovery for one ``pool.kubernetes`` section, writing into ``pool``."""

    def __init__(
        self,
        config: KubernetesPoolConfig,
        pool: PoolState,
        api: SourceFactory,
        *,
        observer: DiscoveryObserver | None = None,
        kv: PodKVSubscriptions | None = None,
    ) -> None:
        self.config = config
        self.api = api
        self.observer = observer or DiscoveryObserver()
        self.kv = kv
        self.membership = Membership(pool)
        self.pods: Reflector[PodView] | None = None
        self.pool_reflector: Reflector[InferencePoolSpec] | None = None
        self._selector: dict[str, str] | None = None
        self._ports: tuple[int, ...] = tuple(config.target_ports or ())
        self._spec_ports: tuple[int, ...] = ()  # the InferencePool's own, last seen
        self._pending: set[asyncio.Task[None]] = set()
        self.synced = asyncio.Event()  # the membership reflects a first answer of the API server

    def _backoff(self) -> Backoff:
        return Backoff(self.config.backoff_initial_ms / 1000, self.config.backoff_max_ms / 1000)

    def start(self) -> None:
        if self.config.inference_pool is not None:
            self.pool_reflector = Reflector(
                self.api.inference_pool(self.config.namespace, self.config.inference_pool),
                parse_inference_pool,
                self._on_pool_change,
                self._backoff(),
                resource="inferencepools",
                observer=self.observer,
            )
            self.pool_reflector.start()
        else:
            assert self.config.label_selector is not None
            self._follow_selector(dict(self.config.label_selector))

    async def wait_synced(self, timeout_s: float) -> bool:
        """True once the pods have been listed (or the InferencePool found missing) within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.synced.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        reflectors = [r for r in (self.pool_reflector, self.pods) if r is not None]
        self.pool_reflector = self.pods = None
        for reflector in reflectors:
            await reflector.stop()
        await asyncio.gather(*self._pending, return_exceptions=True)
        if self.kv is not None:
            await self.kv.stop()

    # --- callbacks of the reflectors ---------------------------------------------------------------
    def _on_pool_change(self, pools: Mapping[str, InferencePoolSpec]) -> None:
        spec = pools.get(self.config.inference_pool or "")
        if spec is None:
            if self._selector is not None:
                log.warning(
                    "InferencePool %s/%s is gone: the pool is empty until it is back",
                    self.config.namespace,
                    self.config.inference_pool,
                )
                self.observer.inference_pool_changed("gone")
            self._selector = None
            self._retire_pods()
            self._apply((), clear=True)
            self.synced.set()
            return
        if self._selector is None:
            self.observer.inference_pool_changed("appeared")
        elif spec.target_ports != self._spec_ports:
            self.observer.inference_pool_changed("target_ports")
        self._spec_ports = spec.target_ports
        ports = tuple(self.config.target_ports or spec.target_ports)
        if ports != self._ports:
            if self._ports:
                log.info("InferencePool %s: target ports %s → %s", spec.name, list(self._ports), list(ports))
            self._ports = ports
            if self.pods is not None:
                self._on_pods_change(self.pods.items)
        if spec.match_labels != self._selector:
            if self._selector is not None:
                log.info("InferencePool %s: selector %s → %s", spec.name, self._selector, spec.match_labels)
                self.observer.inference_pool_changed("selector")
            self._follow_selector(dict(spec.match_labels))

    def _on_pods_change(self, pods: Mapping[str, PodView]) -> None:
        self._apply(pods.values())
        self.synced.set()

    def _apply(self, pods: Iterable[PodView], *, clear: bool = False) -> None:
        pods = list(pods)
        change = self.membership.clear() if clear else self.membership.apply(pods, self._ports)
        if self.kv is not None:
            if clear:
                self.kv.clear()
            else:
                self.kv.sync(pods, self._ports, self.membership.owned)
        counts = dict.fromkeys(POD_STATES, 0)
        for pod in pods:
            counts[pod.state] += 1
        self.observer.membership(
            len(change.added), len(change.removed), len(self.membership.addresses), counts
        )

    # --- pod reflector ---------------------------------------------------------------------------------
    def _follow_selector(self, selector: dict[str, str]) -> None:
        self._retire_pods()
        self._selector = selector
        self.pods = Reflector(
            self.api.pods(self.config.namespace, selector),
            parse_pod,
            self._on_pods_change,
            self._backoff(),
            resource="pods",
            observer=self.observer,
        )
        self.pods.start()

    def _retire_pods(self) -> None:
        """Stop the current pod reflector (its endpoints stay until the next one's first list)."""
        old, self.pods = self.pods, None
        task = old.cancel() if old is not None else None
        if task is not None:
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
