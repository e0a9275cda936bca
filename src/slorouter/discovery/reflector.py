"""List, then watch from the list's resourceVersion, keeping a local copy of the objects in sync.

The loop of a Kubernetes informer's reflector: a watch that ends is resumed from the last version seen
(an event's or a bookmark's); ``410 Gone`` (the version was compacted away) means relist, and the list
replaces the copy wholesale, so nothing missed while away survives or stays missing. Failed requests are
retried after a pause that doubles up to a bound and resets once the server answers again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from slorouter.discovery.objects import ApiObjectError
from slorouter.discovery.observer import DiscoveryObserver
from slorouter.discovery.source import ApiError, ResourceSource, WatchEvent

log = logging.getLogger(__name__)

T = TypeVar("T")
# A watch that the server closes this soon without an event is not resumed at once (a server that closes
# every watch straight away would otherwise be asked again and again).
QUICK_WATCH_S = 1.0


class Backoff:
    """Pauses that double from ``initial_s`` up to ``max_s``, with ±20 % jitter so that many routers do not
    return in step."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._next_s = initial_s
        self._rng = rng or random.Random()

    def reset(self) -> None:
        self._next_s = self.initial_s

    def next_delay(self) -> float:
        delay = self._next_s * self._rng.uniform(0.8, 1.2)
        self._next_s = min(self._next_s * 2, self.max_s)
        return min(delay, self.max_s)

    async def sleep(self) -> None:
        await asyncio.sleep(self.next_delay())


@dataclass(slots=True)
class ReflectorStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0  # 410 Gone: relisted
    errors: int = 0  # failed lists and watches
    malformed: int = 0  # objects that could not be parsed (logged, left out)


def _raw_name(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


class Reflector(Generic[T]):
    """Keeps ``items`` (name → parsed object) equal to the server's objects of ``source``; calls
    ``on_change(items)`` after every list and every event that changed them. Its lists, events and watch
    restarts are reported to ``observer`` under ``resource``."""

    def __init__(
        self,
        source: ResourceSource,
        parse: Callable[[Any], T],
        on_change: Callable[[Mapping[str, T]], None],
        backoff: Backoff,
        *,
        resource: str = "objects",
        observer: DiscoveryObserver | None = None,
    ) -> None:
        self.source = source
        self.parse = parse
        self.on_change = on_change
        self.backoff = backoff
        self.resource = resource
        self.observer = observer or DiscoveryObserver()
        self.items: dict[str, T] = {}
        self.resource_version: str | None = None
        self.synced = asyncio.Event()  # set once the first list has been applied
        self.stats = ReflectorStats()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"slorouter-discovery {self.source.description}"
            )

    def cancel(self) -> asyncio.Task[None] | None:
        """Stop at once (no callback runs after this); returns the task to await, if any."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def stop(self) -> None:
        task = self.cancel()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            if self.resource_version is None and not await self._list():
                await self.backoff.sleep()
                continue
            assert self.resource_version is not None
            started = time.monotonic()
            events = self.stats.events
            self.stats.watches += 1
            try:
                async for event in self.source.watch(self.resource_version):
                    self._apply(event)
                    self.backoff.reset()
            except ApiError as exc:
                self.observer.watch_restarted(self.resource, "expired" if exc.expired else "error")
                if exc.expired:
                    self.stats.expired += 1
                    log.info(
                        "%s: resourceVersion %s expired, relisting",
                        self.source.description,
                        self.resource_version,
                    )
                    self.resource_version = None
                    if self.stats.events == events:  # two 410s in a row: do not hammer the server
                        await self.backoff.sleep()
                    continue
                self.stats.errors += 1
                log.warning("%s: watch failed (%s); resuming", self.source.description, exc)
                await self.backoff.sleep()
                continue
            self.observer.watch_restarted(self.resource, "ended")
            self.observer.synced(self.resource)
            if self.stats.events == events and time.monotonic() - started < QUICK_WATCH_S:
                await self.backoff.sleep()

    async def _list(self) -> bool:
        try:
            result = await self.source.list()
        except ApiError as exc:
            self.stats.errors += 1
            self.observer.listed(self.resource, False)
            log.warning("%s: list failed (%s); retrying", self.source.description, exc)
            return False
        self.stats.lists += 1
        self.observer.listed(self.resource, True)
        self.observer.synced(self.resource)
        items: dict[str, T] = {}
        for obj in result.items:
            name, parsed = self._parse(obj)
            if name is not None and parsed is not None:
                items[name] = parsed
        self.items = items
        self.resource_version = result.resource_version
        self.backoff.reset()
        self.on_change(self.items)
        self.synced.set()
        return True

    def _parse(self, obj: Any) -> tuple[str | None, T | None]:
        name = _raw_name(obj)
        try:
            return name, self.parse(obj)
        except ApiObjectError as exc:
            self.stats.malformed += 1
            self.observer.malformed(self.resource)
            log.error("%s: left out: %s", self.source.description, exc)
            return name, None

    def _apply(self, event: WatchEvent) -> None:
        self.resource_version = event.resource_version
        self.observer.watch_event(self.resource, event.type)
        self.observer.synced(self.resource)
        if event.type == "BOOKMARK":
            self.stats.bookmarks += 1
            return
        self.stats.events += 1
        name, parsed = self._parse(event.object)
        if name is None:
            return
        if event.type == "DELETED" or parsed is None:
            if self.items.pop(name, None) is None:
                return
        else:
            self.items[name] = parsed
        self.on_change(self.items)
