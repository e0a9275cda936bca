"""What discovery reports as it goes. ``DiscoveryObserver`` ignores it all; ``slorouter.metrics``'s
``DiscoveryMetrics`` turns it into Prometheus series (discovery is below the metrics layer, so it only
knows this interface). ``resource`` is ``pods`` or ``inferencepools``."""

from __future__ import annotations

from collections.abc import Mapping


class DiscoveryObserver:
    def listed(self, resource: str, ok: bool) -> None:
        """A list was answered (``ok``) or failed."""

    def watch_event(self, resource: str, event_type: str) -> None:
        """A watch event (``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK``) arrived."""

    def watch_restarted(self, resource: str, reason: str) -> None:
        """A watch ended and is restarted: ``ended`` (by the server, on time), ``expired`` (410 Gone:
        relist) or ``error`` (failed or cut)."""

    def synced(self, resource: str) -> None:
        """The API server's answer brought discovery's copy up to date (a list, an event, a bookmark, a
        watch ended on time)."""

    def malformed(self, resource: str) -> None:
        """An object was left out: it does not have the documented shape."""

    def membership(self, added: int, removed: int, endpoints: int, pods: Mapping[str, int]) -> None:
        """The membership was brought in line: endpoints added and removed, endpoints now, pods by state."""

    def inference_pool_changed(self, change: str) -> None:
        """The InferencePool ``appeared``, is ``gone``, or changed its ``selector`` or ``target_ports``."""

    def kv_event_subscriptions(self, count: int) -> None:
        """Discovered endpoints with a KV-event subscriber, now."""

    def kv_events_config_error(self, source: str) -> None:
        """A pod's KV-event settings could not be used; ``source`` is the annotation at fault."""
