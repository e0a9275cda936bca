"""What each pod's KV cache holds, from the pod's own KV events: block hash → pods, and each pod's blocks.

``apply`` takes a pod's event batches in sequence order: ``BlockStored`` adds its hashes to the pod,
``BlockRemoved`` takes them away, ``AllBlocksCleared`` empties it. Only blocks in GPU memory count (medium
``GPU`` or unset); events about offloaded copies (``CPU``, disk) are ignored, since the engine must bring
those back before it can skip their prefill. ``match`` walks a request's block hashes and tells, per pod, how
many leading blocks it holds.

**Speculative** entries are the router's own: the blocks of a request dispatched to a pod and not yet
computed there, which its events cannot show yet (the request may wait in the pod's queue for seconds).
``speculate`` adds them, ``unspeculate`` takes them away (the producer does so once the events had time to
arrive); ``match`` counts them as held. They are reference-counted per (hash, pod), so the memory they take
is bounded by the requests in flight.

Memory is bounded per pod (``max_blocks_per_pod``): a pod whose events claim more blocks than that (lost
removals, or a bound set below its real cache) is cleared, counted in ``overflows``, and refills from its
next events. Each pod has a slot and a hash's holders are a bitmask of slots, so ``match`` is integer ANDs
and a hash held by one pod shares that pod's one mask object. ``remove_pod`` forgets a pod that left the
pool (its blocks, claims and counters) and frees its slot for the next pod, lowest slots first, so the
masks stay as narrow as the pool is large.

**Trust** (``slorouter.pool.kv_trust``): ``trust`` holds each pod's state (exact, degraded, rebuilding),
fed by the pod's subscriber and the scrape monitor; ``trusted`` is what the precise producer asks before it
uses a pod's blocks. A clear with a reason (``clear_pod(address, reason)``, an overflow) starts the pod's
rebuild. Not thread-safe: the subscribers and the scheduler run on one event loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from slorouter.clock import Clock, MonotonicClock
from slorouter.kvevents.wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from slorouter.pool.kv_trust import KVTrustBoard, PodTrust, TrustReason, TrustThresholds, TrustView

# 4M tokens of 16-token blocks: 4× the cache of an 8B model on a 141 GB H200, 9× on an 80 GB H100.
DEFAULT_MAX_BLOCKS_PER_POD = 262_144


@dataclass(slots=True)
class PodEventStats:
    """Counters of one pod's event stream (the subscriber's and the index's)."""

    batches: int = 0  # applied
    events: int = 0  # applied
    gaps: int = 0  # sequence gaps seen
    replays: int = 0  # gaps recovered in full through the replay socket
    unrecovered: int = 0  # gaps the replay could not fill (the pod's blocks were cleared)
    decode_errors: int = 0  # batches or frames that did not follow the protocol
    restarts: int = 0  # sequence numbers went back: the publisher restarted
    late: int = 0  # batches that came after a later one (out of order) and were skipped
    reconnects: int = 0  # subscriber sessions that failed and were reopened
    overflows: int = 0  # clears because the pod claimed more than max_blocks_per_pod


@dataclass(slots=True)
class _Pod:
    bit: int
    blocks: set[BlockHash] = field(default_factory=set)
    block_size: int = 0  # tokens per block, from its BlockStored events; 0 until one arrived
    stats: PodEventStats = field(default_factory=PodEventStats)


class KVBlockIndex:
    def __init__(
        self,
        max_blocks_per_pod: int = DEFAULT_MAX_BLOCKS_PER_POD,
        *,
        trust: TrustThresholds | None = None,
        clock: Clock | None = None,
    ) -> None:
        if max_blocks_per_pod < 1:
            raise ValueError("max_blocks_per_pod must be >= 1")
        self.max_blocks_per_pod = max_blocks_per_pod
        self.clock: Clock = clock or MonotonicClock()
        self.trust = KVTrustBoard(trust)
        self._holders: dict[BlockHash, int] = {}
        self._pods: dict[str, _Pod] = {}
        self._speculative: dict[BlockHash, int] = {}  # hash → bitmask of pods with a claim
        self._claims: dict[tuple[BlockHash, int], int] = {}  # (hash, pod bit) → claims
        self._free_slots: list[int] = []  # a heap of the slots of removed pods
        self._next_slot = 0

    # --- the pods ------------------------------------------------------------------------------------
    def pod_stats(self, address: str) -> PodEventStats:
        """The pod's counters (created on first use: a subscriber counts before any batch arrives)."""
        return self._pod(address).stats

    def publishing(self, address: str) -> bool:
        """Whether any event batch of the pod was applied (then its matches come from the index)."""
        pod = self._pods.get(address)
        return pod is not None and pod.stats.batches > 0

    def trusted(self, address: str) -> bool:
        """Whether the pod's matches come from the index: it published, and its trust is ``exact``."""
        return self.publishing(address) and self.trust.exact(address)

    def trust_of(self, address: str) -> TrustView | None:
        """The pod's trust state (None: nothing was ever recorded for it)."""
        trust = self.trust.get(address)
        return None if trust is None else trust.view()

    def pod_trust(self, address: str) -> PodTrust:
        """The pod's trust state machine, to feed (created on first use)."""
        return self.trust.pod(address, self.clock.now())

    def block_size(self, address: str) -> int:
        pod = self._pods.get(address)
        return 0 if pod is None else pod.block_size

    def num_blocks(self, address: str) -> int:
        pod = self._pods.get(address)
        return 0 if pod is None else len(pod.blocks)

    @property
    def distinct_blocks(self) -> int:
        return len(self._holders)

    @property
    def addresses(self) -> frozenset[str]:
        """The pods the index has an entry for (counters, blocks or claims)."""
        return frozenset(self._pods)

    def remove_pod(self, address: str) -> None:
        """Forget the pod: its blocks, its speculative claims and its counters; its slot is reused."""
        self.trust.remove(address)
        pod = self._pods.pop(address, None)
        if pod is None:
            return
        bit = pod.bit
        for block_hash in pod.blocks:
            self._forget(block_hash, bit)
        claimed = [key for key in self._claims if key[1] == bit]
        speculative = self._speculative
        for key in claimed:
            del self._claims[key]
            mask = speculative.get(key[0], 0) & ~bit
            if mask:
                speculative[key[0]] = mask
            else:
                speculative.pop(key[0], None)
        heapq.heappush(self._free_slots, bit.bit_length() - 1)

    def clear_pod(self, address: str, reason: TrustReason | None = None) -> None:
        """Forget the pod's blocks; with ``reason`` (a fault, not the pod's own ``AllBlocksCleared``) the
        pod's trust turns ``rebuilding``."""
        if reason is not None:
            self.pod_trust(address).cleared(self.clock.now(), reason)
        pod = self._pods.get(address)
        if pod is None:
            return
        for block_hash in pod.blocks:
            self._forget(block_hash, pod.bit)
        pod.blocks = set()

    # --- events --------------------------------------------------------------------------------------
    def apply(self, address: str, batch: KVEventBatch) -> None:
        pod = self._pod(address)
        bit = pod.bit
        blocks = pod.blocks
        holders = self._holders
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.medium not in (None, MEDIUM_GPU):
                    continue
                pod.block_size = event.block_size
                for block_hash in event.block_hashes:
                    if block_hash not in blocks:
                        blocks.add(block_hash)
                        mask = holders.get(block_hash)
                        holders[block_hash] = bit if mask is None else mask | bit
                if len(blocks) > self.max_blocks_per_pod:
                    self.clear_pod(address, TrustReason.OVERFLOW)
                    blocks = pod.blocks
                    pod.stats.overflows += 1
            elif isinstance(event, BlockRemoved):
                if event.medium not in (None, MEDIUM_GPU):
                    continue
                for block_hash in event.block_hashes:
                    if block_hash in blocks:
                        blocks.discard(block_hash)
                        self._forget(block_hash, bit)
            elif isinstance(event, AllBlocksCleared):
                self.clear_pod(address)
                blocks = pod.blocks
        pod.stats.batches += 1
        pod.stats.events += len(batch.events)

    # --- speculation --------------------------------------------------------------------------------
    def speculate(self, address: str, hashes: list[BlockHash]) -> None:
        """Count ``hashes`` as held by the pod until ``unspeculate`` with the same hashes."""
        bit = self._pod(address).bit
        claims = self._claims
        speculative = self._speculative
        for block_hash in hashes:
            key = (block_hash, bit)
            count = claims.get(key, 0)
            claims[key] = count + 1
            if not count:
                speculative[block_hash] = speculative.get(block_hash, 0) | bit

    def unspeculate(self, address: str, hashes: list[BlockHash]) -> None:
        pod = self._pods.get(address)
        if pod is None:
            return
        bit = pod.bit
        claims = self._claims
        speculative = self._speculative
        for block_hash in hashes:
            key = (block_hash, bit)
            count = claims.get(key, 0)
            if count > 1:
                claims[key] = count - 1
            elif count == 1:
                del claims[key]
                mask = speculative.get(block_hash, 0) & ~bit
                if mask:
                    speculative[block_hash] = mask
                else:
                    speculative.pop(block_hash, None)

    @property
    def speculative_claims(self) -> int:
        return len(self._claims)

    # --- lookups -------------------------------------------------------------------------------------
    def match(self, hashes: list[int], addresses: Iterable[str]) -> dict[str, int]:
        """Per pod of ``addresses``, how many leading blocks of ``hashes`` it holds or is speculated to hold
        (0 for none)."""
        matched: dict[str, int] = {}
        alive = 0
        pod_of_bit: dict[int, str] = {}
        for address in addresses:
            matched[address] = 0
            pod = self._pods.get(address)
            if pod is not None:
                alive |= pod.bit
                pod_of_bit[pod.bit] = address
        holders = self._holders
        speculative = self._speculative
        depth = 0
        for block_hash in hashes:
            if not alive:
                break
            survivors = alive & (holders.get(block_hash, 0) | speculative.get(block_hash, 0))
            if survivors != alive:
                for bit in _bits(alive & ~survivors):
                    matched[pod_of_bit[bit]] = depth
                alive = survivors
            depth += 1
        for bit in _bits(alive):
            matched[pod_of_bit[bit]] = depth
        return matched

    # --- helpers -------------------------------------------------------------------------------------
    def _pod(self, address: str) -> _Pod:
        pod = self._pods.get(address)
        if pod is None:
            if self._free_slots:
                slot = heapq.heappop(self._free_slots)
            else:
                slot = self._next_slot
                self._next_slot += 1
            pod = self._pods[address] = _Pod(bit=1 << slot)
        return pod

    def _forget(self, block_hash: BlockHash, bit: int) -> None:
        mask = self._holders.get(block_hash, 0) & ~bit
        if mask:
            self._holders[block_hash] = mask
        else:
            self._holders.pop(block_hash, None)


def _bits(mask: int) -> list[int]:
    bits = []
    while mask:
        lowest = mask & -mask
        bits.append(lowest)
        mask ^= lowest
    return bits
