"""Pool state: endpoints, their scraped metrics, health and router-local in-flight load."""

from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState

__all__ = ["Endpoint", "MetricsSnapshot", "PoolState"]
