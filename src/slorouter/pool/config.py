"""The ``pool`` section of the configuration: which model servers to route to and how to watch them."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from slorouter.pool.kv_index import DEFAULT_MAX_BLOCKS_PER_POD
from slorouter.pool.state import Endpoint
from slorouter.validation import StrictModel


def validate_address(address: str) -> str:
    """Check a ``host:port`` (IPv6 hosts in brackets: ``[::1]:8000``) and return it unchanged."""
    if not isinstance(address, str):
        raise ValueError(f"expected a 'host:port' string, got {address!r}")
    if "://" in address or "/" in address:
        raise ValueError(f"{address!r} must be a bare 'host:port', without scheme or path")
    if any(ch.isspace() for ch in address):
        raise ValueError(f"{address!r} must not contain whitespace")
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"{address!r} has no port: expected 'host:port'")
    if host.startswith("["):
        if not host.endswith("]") or len(host) == 2:
            raise ValueError(f"{address!r}: an IPv6 host must be written '[addr]:port'")
    elif not host or ":" in host:
        raise ValueError(f"{address!r} has an empty or malformed host: expected 'host:port'")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{address!r}: port must be an integer in 1-65535")
    return address


def validate_zmq_endpoint(endpoint: str) -> str:
    """Check a ZMQ address a subscriber connects to: ``tcp://host:port``, ``ipc://path`` or ``inproc://name``."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise ValueError(f"{endpoint!r} must be a ZMQ address: tcp://host:port, ipc://path or inproc://name")
    if scheme == "tcp":
        validate_address(rest)
    return endpoint


class KVEventsSourceConfig(StrictModel):
    """Where a model server publishes its KV events (vLLM ``--kv-events-config``: ``endpoint``,
    ``replay_endpoint``, ``topic``; here the addresses the router connects to)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""  # prefix filter of the SUB socket; "" takes every topic

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        return None if value is None else validate_zmq_endpoint(value)


class EndpointConfig(StrictModel):
    """One model server: a bare ``"host:port"`` in YAML, or this mapping to add a name, labels and its KV
    events."""

    address: str
    name: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    kv_events: KVEventsSourceConfig | None = None

    @field_validator("address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        return validate_address(value)


class PoolConfig(StrictModel):
    """Static pool membership and the scraper's settings."""

    endpoints: list[EndpointConfig] = Field(min_length=1)
    scrape_interval_ms: float = Field(default=50, gt=0)
    scrape_timeout_ms: float = Field(default=1000, gt=0)
    unhealthy_after_failures: int = Field(default=3, ge=1)
    kv_events_max_blocks_per_pod: int = Field(default=DEFAULT_MAX_BLOCKS_PER_POD, ge=1)
    kv_events_replay_timeout_ms: float = Field(default=1000, gt=0)
    kv_events_reconnect_ms: float = Field(default=1000, gt=0)

    @field_validator("endpoints", mode="before")
    @classmethod
    def _expand_bare_addresses(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"address": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("endpoints")
    @classmethod
    def _reject_duplicates(cls, value: list[EndpointConfig]) -> list[EndpointConfig]:
        seen: set[str] = set()
        for endpoint in value:
            if endpoint.address in seen:
                raise ValueError(f"duplicate endpoint address {endpoint.address!r}")
            seen.add(endpoint.address)
        return value

    @property
    def scrape_interval_s(self) -> float:
        return self.scrape_interval_ms / 1000

    @property
    def scrape_timeout_s(self) -> float:
        return self.scrape_timeout_ms / 1000


def endpoints_from_config(config: PoolConfig) -> list[Endpoint]:
    return [Endpoint(e.address, e.name, dict(e.labels)) for e in config.endpoints]
