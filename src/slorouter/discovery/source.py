"""What a reflector needs of the API server for one kind of object: a list and a watch from a version.

``slorouter.discovery.kube_api`` implements it with the Kubernetes client library; the types here keep the
library's untyped objects out of the rest of discovery.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


class ApiError(Exception):
    """A failed request, or an ERROR event on a watch. ``status`` is the HTTP status or the Status object's
    code (410: the resourceVersion is too old, relist); 0 when the server could not be reached."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status

    @property
    def expired(self) -> bool:
        return self.status == 410


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[Any]  # the raw objects, parsed by the reflector's owner
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    object: Any
    resource_version: str


class ResourceSource(Protocol):
    """One kind of object in one namespace, narrowed by a selector."""

    description: str  # for logs: "pods app=vllm in ns"

    async def list(self) -> ListResult:
        """A consistent list; raises ``ApiError``."""
        ...

    def watch(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Changes after ``resource_version`` until the server ends the watch; raises ``ApiError``."""
        ...
