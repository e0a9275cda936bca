"""The pool as a struct of arrays.

Scheduling works on numpy columns over candidate endpoints, so the pool keeps every per-endpoint signal in
one array per signal, indexed by the endpoint's position. The metrics scraper writes scraped values, the
in-flight tracker updates the router-local counters, and a ``Candidates`` view (see
``slorouter.scheduling.types``) slices all columns at once for one request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from slorouter.pool.dialects import Dialect

# Columns scraped from the model server's /metrics.
SCRAPED_COLUMNS: dict[str, type] = {
    "waiting": np.int64,  # vllm:num_requests_waiting
    "running": np.int64,  # vllm:num_requests_running
    "kv_usage": np.float64,  # vllm:kv_cache_usage_perc, 0..1
    "block_size": np.int64,  # vllm:cache_config_info{block_size}
    "num_gpu_blocks": np.int64,  # vllm:cache_config_info{num_gpu_blocks}
    "metrics_time": np.float64,  # clock time of the scrape that produced the row
    # Bits of the signals the endpoint's page lacks (MISSING_*): those columns hold in-flight estimates.
    "metrics_missing": np.int64,
}
MISSING_WAITING, MISSING_RUNNING, MISSING_KV = 1, 2, 4
MISSING_BITS = {"waiting": MISSING_WAITING, "running": MISSING_RUNNING, "kv_usage": MISSING_KV}
# KV capacity assumed for the in-flight KV estimate of a server that reports neither KV usage nor its cache
# size: the original's default per-pod prefix LRU size (31,250 blocks of 16 tokens, Llama-3-8B on an H100).
DEFAULT_FALLBACK_KV_CAPACITY_TOKENS = 500_000
# Columns kept by the router itself, always fresh.
INFLIGHT_COLUMNS: dict[str, type] = {
    "inflight_requests": np.int64,  # dispatched and not yet finished
    "inflight_prefill_tokens": np.int64,  # prompt tokens of requests not yet past their first token
    "inflight_decode_tokens": np.int64,  # context tokens of requests past their first token
    "inflight_decoding": np.int64,  # requests past their first token (decoding)
}
ALL_COLUMNS: dict[str, type] = {**SCRAPED_COLUMNS, **INFLIGHT_COLUMNS, "healthy": np.bool_}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model-server replica, identified by ``host:port``."""

    address: str
    name: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One scrape of a model server's load signals."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    block_size: int = 0
    num_gpu_blocks: int = 0
    # Signals ("waiting", "running", "kv_usage") the page lacks: the pool estimates them from in-flight
    # counts.
    missing: tuple[str, ...] = ()
    # Of the pod's process, for the KV-event trust (None: not on the page): process_start_time_seconds and
    # the prefix-cache query counter (vllm:prefix_cache_queries_total).
    process_start_s: float | None = None
    prefix_cache_queries: float | None = None


@dataclass(frozen=True, slots=True)
class ServingSignals:
    """What the last scrape said of the pod's process: whether it serves (running requests, its
    prefix-cache query counter) and when it started; ``at`` is the scrape's time."""

    at: float
    running: int | None  # None: the page lacks it
    process_start_s: float | None
    prefix_cache_queries: float | None


class PoolState:
    """Endpoints and their per-endpoint signals, one numpy column per signal.

    Endpoints are healthy when added; the scraper marks them unhealthy when their scrapes keep failing.
    Not thread-safe: it is owned by one event loop (or by the discrete-event simulator).
    """

    def __init__(
        self,
        endpoints: list[Endpoint] | None = None,
        fallback_kv_capacity_tokens: int = DEFAULT_FALLBACK_KV_CAPACITY_TOKENS,
    ) -> None:
        self.fallback_kv_capacity_tokens = fallback_kv_capacity_tokens
        # The dialect each endpoint's page was last read in, by address (written by the scraper).
        self.metric_dialects: dict[str, Dialect] = {}
        self.serving: dict[str, ServingSignals] = {}  # by address, from the last scrape
        self.endpoints: list[Endpoint] = []
        self._position: dict[str, int] = {}
        self._incarnation: dict[str, int] = {}
        self._adds = 0
        # Cached; reset by every change of health or membership.
        self._healthy_positions: np.ndarray | None = None
        self.columns: dict[str, np.ndarray] = {
            name: np.zeros(0, dtype=dtype) for name, dtype in ALL_COLUMNS.items()
        }
        for endpoint in endpoints or []:
            self.add(endpoint)

    def __len__(self) -> int:
        return len(self.endpoints)

    def __contains__(self, address: str) -> bool:
        return address in self._position

    def position(self, address: str) -> int:
        """Current index of an endpoint; raises KeyError when it has left the pool."""
        return self._position[address]

    def incarnation(self, address: str) -> int | None:
        """Identifies one stay of an endpoint in the pool: a removed and re-added endpoint gets a new one."""
        return self._incarnation.get(address)

    def get(self, address: str) -> Endpoint | None:
        pos = self._position.get(address)
        return None if pos is None else self.endpoints[pos]

    def add(self, endpoint: Endpoint) -> None:
        if endpoint.address in self._position:
            raise ValueError(f"endpoint {endpoint.address} is already in the pool")
        self._position[endpoint.address] = len(self.endpoints)
        self._adds += 1
        self._incarnation[endpoint.address] = self._adds
        self.endpoints.append(endpoint)
        self._healthy_positions = None
        for name, column in self.columns.items():
            initial = True if name == "healthy" else (-math.inf if name == "metrics_time" else 0)
            self.columns[name] = np.append(column, np.array([initial], dtype=column.dtype))

    def remove(self, address: str) -> Endpoint:
        pos = self._position.pop(address)
        del self._incarnation[address]
        self.metric_dialects.pop(address, None)
        self.serving.pop(address, None)
        endpoint = self.endpoints.pop(pos)
        self._healthy_positions = None
        for name, column in self.columns.items():
            self.columns[name] = np.delete(column, pos)
        for later in self.endpoints[pos:]:
            self._position[later.address] -= 1
        return endpoint

    # --- writers -------------------------------------------------------------------------------------
    def set_metrics(self, address: str, snapshot: MetricsSnapshot, at: float) -> None:
        pos = self._position[address]
        cols = self.columns
        cols["waiting"][pos] = snapshot.waiting
        cols["running"][pos] = snapshot.running
        cols["kv_usage"][pos] = snapshot.kv_usage
        cols["block_size"][pos] = snapshot.block_size
        cols["num_gpu_blocks"][pos] = snapshot.num_gpu_blocks
        cols["metrics_time"][pos] = at
        self.serving[address] = ServingSignals(
            at,
            None if "running" in snapshot.missing else snapshot.running,
            snapshot.process_start_s,
            snapshot.prefix_cache_queries,
        )
        mask = 0
        for signal in snapshot.missing:
            mask |= MISSING_BITS[signal]
        cols["metrics_missing"][pos] = mask
        if mask:
            self._estimate(pos, mask)

    def _estimate(self, pos: int, mask: int) -> None:
        """Fill the signals in ``mask`` (missing from the endpoint's page) from the router's in-flight counts:
        requests dispatched and unfinished are running, less those the page says wait (or, without a running
        count, more than the page says run wait); the KV fraction is the in-flight tokens over the cache."""
        cols = self.columns
        inflight = int(cols["inflight_requests"][pos])
        if mask & MISSING_WAITING and mask & MISSING_RUNNING:
            cols["waiting"][pos], cols["running"][pos] = 0, max(0, inflight)
        elif mask & MISSING_WAITING:
            cols["waiting"][pos] = max(0, inflight - int(cols["running"][pos]))
        elif mask & MISSING_RUNNING:
            cols["running"][pos] = max(0, inflight - int(cols["waiting"][pos]))
        if mask & MISSING_KV:
            capacity = int(cols["block_size"][pos]) * int(cols["num_gpu_blocks"][pos])
            if capacity <= 0:
                capacity = self.fallback_kv_capacity_tokens
            tokens = int(cols["inflight_prefill_tokens"][pos]) + int(cols["inflight_decode_tokens"][pos])
            cols["kv_usage"][pos] = min(1.0, max(0.0, tokens / capacity))

    def set_healthy(self, address: str, healthy: bool) -> None:
        self.columns["healthy"][self._position[address]] = healthy
        self._healthy_positions = None

    def add_inflight(
        self, address: str, requests: int, prefill_tokens: int, decode_tokens: int, decoding: int = 0
    ) -> None:
        """Add (negative values: remove) router-local in-flight load; a missing endpoint is a no-op."""
        pos = self._position.get(address)
        if pos is None:
            return
        cols = self.columns
        cols["inflight_requests"][pos] += requests
        cols["inflight_prefill_tokens"][pos] += prefill_tokens
        cols["inflight_decode_tokens"][pos] += decode_tokens
        if decoding:
            cols["inflight_decoding"][pos] += decoding
        mask = int(cols["metrics_missing"][pos])
        if mask:
            self._estimate(pos, mask)

    # --- readers -------------------------------------------------------------------------------------
    def healthy_positions(self) -> np.ndarray:
        """Positions of the healthy endpoints (a read-only array, shared until health or membership changes).

        Health is written through ``set_healthy`` (not into ``columns["healthy"]``), which keeps this fresh.
        """
        positions = self._healthy_positions
        if positions is None:
            positions = self.columns["healthy"].nonzero()[0]
            positions.flags.writeable = False
            self._healthy_positions = positions
        return positions

    def is_healthy(self, address: str) -> bool:
        pos = self._position.get(address)
        return pos is not None and bool(self.columns["healthy"][pos])

    def value(self, address: str, column: str) -> float:
        return self.columns[column][self._position[address]].item()
