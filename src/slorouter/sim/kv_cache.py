"""The simulated engine's paged KV cache with automatic prefix caching, after vLLM V1's block pool and
``KVCacheManager``: block allocation, the prefix-cache hash table, LRU eviction and free-block accounting.

``num_blocks`` blocks of ``block_size`` tokens. Full blocks are registered under a hash chain of their token
ids; a request reuses the longest cached run of its leading full blocks. Blocks nobody references stay
cached until evicted, least recently freed first (a request's blocks are freed tail first). Never-used
blocks are handed out in id order before any freed one, as vLLM's free queue starts with all blocks in id
order and appends freed blocks at its tail. Generated tokens are the fixed text of ``slorouter.sim.text``,
so blocks holding them are hashed (and shared) too.

The scheduler owns the decisions (who gets blocks, whom to preempt); this module only keeps the books, on
the ``KVSequence`` part of each request.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import xxhash

from slorouter.kvevents.sim_hash import ROOT_HASH as _ROOT_HASH
from slorouter.kvevents.sim_hash import block_hashes
from slorouter.sim.text import PERIOD, output_bytes
from slorouter.tokenizer import BYTES_PER_TOKEN


class KVSequence:
    """A request's KV-cache state: its prompt, block table, block hashes and remembered prefix lookup."""

    __slots__ = (
        "block_hashes",
        "blocks",
        "hit_blocks",
        "hit_mark",
        "num_cached_blocks",
        "prompt_bytes",
        "prompt_len",
    )

    def __init__(self, prompt_bytes: bytes, block_hashes: list[int]) -> None:
        self.prompt_bytes = prompt_bytes
        self.prompt_len = len(prompt_bytes) // BYTES_PER_TOKEN
        self.block_hashes = block_hashes  # of its full blocks so far (prompt, then generated tokens)
        self.blocks: list[int] = []  # block table
        self.num_cached_blocks = 0  # leading blocks registered in the prefix cache
        # While waiting: the cached blocks of its leading blocks found by the last lookup, valid while no
        # block has left the prefix cache since (the manager's eviction count was hit_mark then).
        self.hit_blocks: list[int] | None = None
        self.hit_mark = -1


class BlockEvents(Protocol):
    """Where a manager reports changes to its prefix cache, in the order they happen (vLLM's KV events)."""

    def stored(self, seq: KVSequence, j: int) -> None:
        """Block ``j`` of ``seq`` entered the prefix cache under ``seq.block_hashes[j]``."""

    def removed(self, block_hash: int) -> None:
        """The block cached under ``block_hash`` was evicted."""


class KVBlockManager:
    """Blocks, their reference counts, the free queue and the prefix cache. Callers check for free blocks
    (``num_free_blocks``, ``can_admit``) before they allocate."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._next_fresh = 0
        self._ref: list[int] = []
        self._hash_of: list[int | None] = []
        self._free: OrderedDict[int, None] = OrderedDict()  # freed blocks, least recently freed first
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._evictions = 0  # hashes ever removed from _cached (the only change that can shorten a hit run)
        # Bytes of a block of generated tokens, by the output position it starts at modulo the text's period.
        self._output_blocks = [output_bytes(k, k + block_size) for k in range(PERIOD)]
        self.events: BlockEvents | None = None  # off unless a KV-event publisher listens

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request references (cached ones included: they are evicted when taken)."""
        return self.num_blocks - self._next_fresh + len(self._free)

    def prompt_block_hashes(self, prompt: bytes) -> list[int]:
        """The hash chain of the prompt's full blocks (``prompt``: packed uint32 token ids)."""
        return block_hashes(prompt, self.block_size)

    def cached_prefix_blocks(self, hashes: list[int]) -> int:
        """How many of ``hashes``' leading blocks the prefix cache holds now (a read: nothing changes)."""
        cached = self._cached
        for j, block_hash in enumerate(hashes):
            if block_hash not in cached:
                return j
        return len(hashes)

    # ------------------------------------------------------------------------------------ admission

    def lookup_prefix(self, seq: KVSequence, num_tokens: int) -> list[int]:
        """Blocks of the longest cached run of the sequence's leading full blocks, covering fewer than its
        ``num_tokens`` tokens (as in vLLM, the last token is always computed).

        The run is remembered on the sequence (``hit_blocks``): while it waits for KV space, each step looks
        it up again, and as long as no block left the cache since, the run found then is still cached
        (entries are only added or evicted, never remapped; a sequence's block hashes only grow), so the
        lookup resumes where it stopped."""
        cached = self._cached
        hashes = seq.block_hashes
        limit = min(len(hashes), (num_tokens - 1) // self.block_size)
        hits = seq.hit_blocks
        if hits is None or seq.hit_mark != self._evictions or len(hits) > limit:
            hits = []
        for j in range(len(hits), limit):
            bid = cached.get(hashes[j])
            if bid is None:
                break
            hits.append(bid)
        seq.hit_blocks = hits
        seq.hit_mark = self._evictions
        return hits

    def can_admit(self, hits: list[int], num_new_blocks: int) -> bool:
        """Whether the cached ``hits`` plus ``num_new_blocks`` new blocks fit: hit blocks no running request
        references come off the free queue too."""
        ref = self._ref
        revived = list(map(ref.__getitem__, hits)).count(0) if hits else 0
        return num_new_blocks + revived <= self.num_free_blocks

    def admit(self, seq: KVSequence, hits: list[int], num_new_blocks: int) -> None:
        """Give a sequence without blocks the cached ``hits`` (from ``lookup_prefix``) and new blocks."""
        seq.hit_blocks = None  # the list becomes its block table
        ref = self._ref
        for bid in hits:
            if ref[bid] == 0:
                del self._free[bid]
            ref[bid] += 1
        seq.blocks = hits
        seq.num_cached_blocks = len(hits)
        if num_new_blocks:
            hits += self._allocate(num_new_blocks)

    # ----------------------------------------------------------------------------------- allocation

    def append_blocks(self, seq: KVSequence, n: int) -> None:
        seq.blocks += self._allocate(n)

    def append_block(self, seq: KVSequence) -> None:
        """One more block: a never-used one if any is left, else the least recently freed one, evicting it
        from the prefix cache."""
        bid = self._next_fresh
        if bid < self.num_blocks:
            self._next_fresh = bid + 1
            self._ref.append(1)
            self._hash_of.append(None)
        else:
            bid = self._free.popitem(last=False)[0]
            block_hash = self._hash_of[bid]
            if block_hash is not None:
                if self._cached.get(block_hash) == bid:
                    del self._cached[block_hash]
                    self._evictions += 1
                    if self.events is not None:
                        self.events.removed(block_hash)
                self._hash_of[bid] = None
            self._ref[bid] = 1
        seq.blocks.append(bid)

    def _allocate(self, n: int) -> list[int]:
        fresh = min(n, self.num_blocks - self._next_fresh)
        start = self._next_fresh
        blocks = list(range(start, start + fresh))
        if fresh:
            self._next_fresh = start + fresh
            self._ref += [1] * fresh
            self._hash_of += [None] * fresh
        if fresh < n:  # the eviction of append_block, inlined: this runs for every block of every prompt
            popitem = self._free.popitem
            ref = self._ref
            hash_of = self._hash_of
            cached = self._cached
            for _ in range(n - fresh):
                bid = popitem(last=False)[0]
                block_hash = hash_of[bid]
                if block_hash is not None:
                    if cached.get(block_hash) == bid:
                        del cached[block_hash]
                        self._evictions += 1
                        if self.events is not None:
                            self.events.removed(block_hash)
                    hash_of[bid] = None
                ref[bid] = 1
                blocks.append(bid)
        return blocks

    def free(self, seq: KVSequence) -> None:
        """Release the sequence's blocks, tail first; those nobody else references join the free queue."""
        ref = self._ref
        free = self._free
        for bid in reversed(seq.blocks):
            ref[bid] -= 1
            if ref[bid] == 0:
                free[bid] = None
        seq.blocks = []
        seq.num_cached_blocks = 0

    # --------------------------------------------------------------------------------- prefix cache

    def cache_full_blocks(self, seq: KVSequence, num_tokens: int) -> None:
        """Register in the prefix cache the sequence's full blocks among its first ``num_tokens`` tokens
        (at most the tokens it has: prompt and generated so far)."""
        block_size = self.block_size
        full = num_tokens // block_size
        start = seq.num_cached_blocks
        if full <= start:
            return
        hashes = seq.block_hashes
        prompt_len = seq.prompt_len
        first = start * block_size
        if full == start + 1 and len(hashes) == start and first >= prompt_len:
            # The usual case while decoding: one more full block, all generated tokens.
            block_hash = xxhash.xxh3_64_intdigest(
                self._output_blocks[(first - prompt_len) % PERIOD], hashes[start - 1] if start else _ROOT_HASH
            )
            hashes.append(block_hash)
            if block_hash not in self._cached:
                self._cached[block_hash] = bid = seq.blocks[start]
                self._hash_of[bid] = block_hash
                if self.events is not None:
                    self.events.stored(seq, start)
            seq.num_cached_blocks = full
            return
        j = len(hashes)
        if j < full:  # blocks holding generated tokens
            output_blocks = self._output_blocks
            digest = xxhash.xxh3_64_intdigest
            parent = hashes[j - 1] if j else _ROOT_HASH
            while j < full:
                first = j * block_size
                if first >= prompt_len:  # all generated: one of the precomputed blocks
                    data = output_blocks[(first - prompt_len) % PERIOD]
                else:
                    data = self.block_bytes(seq, j)
                parent = digest(data, parent)
                hashes.append(parent)
                j += 1
        cached = self._cached
        hash_of = self._hash_of
        blocks = seq.blocks
        events = self.events
        for j in range(start, full):
            block_hash = hashes[j]
            if block_hash not in cached:
                bid = blocks[j]
                cached[block_hash] = bid
                hash_of[bid] = block_hash
                if events is not None:
                    events.stored(seq, j)
        seq.num_cached_blocks = full

    def block_bytes(self, seq: KVSequence, j: int) -> bytes:
        """The token bytes of the sequence's block ``j`` (prompt, generated tokens or both)."""
        block_size = self.block_size
        first, last = j * block_size, (j + 1) * block_size
        prompt_len = seq.prompt_len
        if last <= prompt_len:
            return seq.prompt_bytes[first * BYTES_PER_TOKEN : last * BYTES_PER_TOKEN]
        if first >= prompt_len:
            return self._output_blocks[(first - prompt_len) % PERIOD]
        return seq.prompt_bytes[first * BYTES_PER_TOKEN :] + output_bytes(0, last - prompt_len)
