"""The pool shape: what about the pool, besides the features, decides how fast a request is served.

The features describe load (queues, KV-cache usage, tokens in flight), not the replica: the models learn the
latency of *these* replicas under that load. What a replica is shows in the one static property every vLLM
(and SGLang) server reports, its KV-cache configuration (``vllm:cache_config_info``: ``block_size`` and
``num_gpu_blocks``). ``num_gpu_blocks`` is what is left of GPU memory after the weights, so it changes
with the model, the GPU, the tensor parallelism and the memory settings, which are exactly the changes that
make learnt latencies wrong; and ``kv_cache_percentage`` is relative to it, so the same feature value means
another number of cached tokens on another configuration.

A pool's shape is the set of distinct (block_size, num_gpu_blocks) pairs of its endpoints (endpoints that
report none, e.g. before their first successful scrape, are left out). Replica counts and addresses are not
part of it: scaling a pool up or down leaves each replica's latency under a given load unchanged.

Saved state *fits* the pool when every configuration in the pool was in the pool the state was learnt on: a
pool that lost a configuration (or whose replicas of one are down at the restart) still fits; a
configuration the models never saw does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slorouter.pool.state import PoolState


class PoolShapeMismatchError(ValueError):
    """Saved models or samples learnt on a pool of another shape."""


@dataclass(frozen=True, slots=True)
class PoolShape:
    """Distinct KV-cache configurations, (block_size, num_gpu_blocks) pairs, sorted."""

    kv_caches: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, pool: PoolState) -> PoolShape:
        """The shape of ``pool`` from its last scrape."""
        pairs = zip(pool.columns["block_size"].tolist(), pool.columns["num_gpu_blocks"].tolist(), strict=True)
        return cls(tuple(sorted({(int(b), int(n)) for b, n in pairs if b > 0 and n > 0})))

    def union(self, other: PoolShape) -> PoolShape:
        return PoolShape(tuple(sorted({*self.kv_caches, *other.kv_caches})))

    def covers(self, other: PoolShape) -> bool:
        """True when every configuration of ``other`` is one of this shape's."""
        return set(other.kv_caches) <= set(self.kv_caches)

    def to_dict(self) -> dict[str, Any]:
        return {"kv_caches": [{"block_size": b, "num_gpu_blocks": n} for b, n in self.kv_caches]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolShape:
        """``ValueError`` unless ``data`` is a ``to_dict`` of positive integer pairs."""
        try:
            pairs = [(item["block_size"], item["num_gpu_blocks"]) for item in data["kv_caches"]]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"invalid pool shape {data!r}: {exc!r}") from None
        if not all(type(v) is int and v > 0 for pair in pairs for v in pair):
            raise ValueError(
                f"invalid pool shape {data!r}: block sizes and block counts must be integers > 0"
            )
        return cls(tuple(sorted(set(pairs))))

    def describe(self) -> str:
        if not self.kv_caches:
            return "no reported KV-cache configuration"
        return ", ".join(f"{n} blocks of {b} tokens" for b, n in self.kv_caches)

    def check_saved(self, stored: Mapping[str, Any] | None, *, what: str) -> PoolShape:
        """The shape ``stored`` (a ``to_dict``) with which ``what`` was saved, if it fits this pool; else
        ``PoolShapeMismatchError`` saying why."""
        if stored is None:
            raise PoolShapeMismatchError(f"{what} records no pool shape (saved by an older slorouter)")
        try:
            saved = PoolShape.from_dict(stored)
        except ValueError as exc:
            raise PoolShapeMismatchError(f"{what}: {exc}") from None
        if not saved.covers(self):
            new = PoolShape(tuple(c for c in self.kv_caches if c not in saved.kv_caches))
            raise PoolShapeMismatchError(
                f"{what} was learnt on a pool of {saved.describe()}, but this pool also has {new.describe()}"
            )
        return saved
