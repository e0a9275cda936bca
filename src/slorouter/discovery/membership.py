"""The pool endpoints discovery owns: every serving pod × every target port, applied to ``PoolState`` as a
difference, so endpoints that stay keep their scraped signals and in-flight counts."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from slorouter.discovery.objects import PodView
from slorouter.pool.state import Endpoint, PoolState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MembershipChange:
    added: tuple[str, ...]
    removed: tuple[str, ...]


def desired_endpoints(pods: Iterable[PodView], ports: Sequence[int]) -> dict[str, Endpoint]:
    """Address → endpoint for the serving pods. Should two pods claim one IP (an IP reused before the old
    pod's deletion arrived), the pod first by name keeps it, so the choice does not depend on event order."""
    endpoints: dict[str, Endpoint] = {}
    for pod in sorted(pods, key=lambda p: p.name):
        if not pod.serving:
            continue
        for port in ports:
            address = pod.address(port)
            if address in endpoints:
                log.warning(
                    "pods %s and %s both have IP %s: %s keeps it",
                    endpoints[address].name,
                    pod.name,
                    pod.ip,
                    endpoints[address].name,
                )
                continue
            endpoints[address] = Endpoint(address, pod.name, dict(pod.meta.labels))
    return endpoints


class Membership:
    """Adds and removes the endpoints it owns in ``pool``; leaves any other endpoint alone."""

    def __init__(self, pool: PoolState) -> None:
        self.pool = pool
        self._owned: dict[str, Endpoint] = {}

    @property
    def addresses(self) -> frozenset[str]:
        return frozenset(self._owned)

    @property
    def owned(self) -> Mapping[str, Endpoint]:
        """Address → endpoint of the endpoints discovery put in the pool (a read-only view)."""
        return MappingProxyType(self._owned)

    def apply(self, pods: Iterable[PodView], ports: Sequence[int]) -> MembershipChange:
        desired = desired_endpoints(pods, ports)
        removed = [
            address
            for address, endpoint in self._owned.items()
            if desired.get(address) != endpoint  # gone, or its pod or labels changed
        ]
        for address in removed:
            del self._owned[address]
            if address in self.pool:
                self.pool.remove(address)
        added = []
        for address, endpoint in desired.items():
            if address in self._owned:
                continue
            if address in self.pool:
                log.warning("endpoint %s is already in the pool (not discovered): left as it is", address)
                continue
            self.pool.add(endpoint)
            self._owned[address] = endpoint
            added.append(address)
        if added or removed:
            log.info(
                "pool membership: %d endpoints added, %d removed, %d discovered",
                len(added),
                len(removed),
                len(self._owned),
            )
        return MembershipChange(tuple(added), tuple(removed))

    def clear(self) -> MembershipChange:
        return self.apply((), ())
