"""Approximate prefix-cache affinity (reference §2.4): ``approx-prefix-cache-producer`` estimates how much of
the request's prompt each candidate already holds in its KV cache, ``prefix-cache-scorer`` turns that into a
score.

The producer hashes the prompt in blocks (a chain, so a block's hash names the whole prefix up to it) and
looks the hashes up in an index of what the router has sent where. The index is updated when a request is
dispatched (PreRequest): it never sees the real cache, it models it. At dispatch the producer also tells
the framework the request's cached prompt tokens (the share of the prompt the chosen endpoint held), which
the in-flight accounting leaves out of the endpoint's pending prefill.

With ``indexResponses`` (default on) the index also follows the reply: the producer asks for as much of the
reply as the hashed prefix has room for (``reply_chars_wanted``), and when a response ends, the blocks of
the prompt followed by the generated text (``ResponseInfo.history_text``, built by the framework in the
prompt's own form) are recorded on the endpoint that generated it, as vLLM caches generated tokens too. A
conversation's next turn, which sends that history back, then matches it in full on that endpoint instead
of only up to the previous prompt.

Deliberate differences from the original, both to model vLLM's cache more closely:
- a candidate's match is its *strict* prefix: counting stops at the first block it does not hold (the
  original counts every block it holds within the run of blocks held by *any* server, which over-counts
  once early blocks were evicted);
- a request's blocks enter a server's LRU last-block-first, so the shared leading blocks are the most
  recently used and are evicted last (vLLM likewise evicts the tail of a sequence first);
- replies are indexed (above); the original indexes prompts only.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import xxhash
from pydantic import Field, model_validator

from slorouter.pool.state import PoolState
from slorouter.scheduling.datakeys import PREFIX_BLOCK_SIZE_TOKENS, PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS
from slorouter.scheduling.plugin import (
    DataProducer,
    ListScorer,
    Plugin,
    PluginContext,
    PluginParams,
    PreRequest,
    PreRequestResult,
    ResponseBodyProcessor,
    ResponseInfo,
)
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest, SchedulingResult

CHARS_PER_TOKEN = 4  # the original's fixed estimate; "characters" are UTF-8 bytes, as in Go strings
PREFILL_PROFILE = "prefill"  # the disaggregation profile whose target also gets the request's blocks

_hash64 = xxhash.xxh64_intdigest
_pack_u64 = struct.Struct("<Q").pack


def _utf8(text: str) -> bytes:
    """``text`` in UTF-8; a lone surrogate (JSON lets a client send ``"\\ud800"``) as ``surrogatepass``
    writes it, as the tokenizer counts it, so that such a prompt is hashed rather than failing the plugin."""
    return text.encode("utf-8", "surrogatepass")


def prefix_seed(model: str, cache_salt: str = "") -> int:
    """xxhash64 of the target model name followed by the cache salt: the chain's starting value."""
    return _hash64(_utf8(model + cache_salt))


def prefix_block_hashes(data: bytes, seed: int, block_chars: int, max_blocks: int) -> list[int]:
    """Chained block hashes: h_i = xxhash64(block_i ‖ little-endian uint64(h_{i−1})), h_{−1} = seed.

    Input shorter than one block gives no hashes. Input beyond ``max_blocks`` blocks is ignored; otherwise a
    trailing partial block is hashed like a full one.
    """
    if len(data) < block_chars:
        return []
    return _chain_hashes(data, seed, block_chars, max_blocks)


def _chain_hashes(data: bytes, previous: int, block_chars: int, max_blocks: int) -> list[int]:
    """The chain over ``data`` (at most ``max_blocks`` blocks, a trailing partial one included) after
    ``previous``."""
    if max_blocks <= 0:
        return []
    limit = max_blocks * block_chars
    if len(data) > limit:
        data = data[:limit]
    hashes: list[int] = []
    append = hashes.append
    # The chain is sequential; plain slicing and concatenation measured faster than a reused buffer or a
    # streaming hasher for 64-byte blocks.
    for start in range(0, len(data), block_chars):
        previous = _hash64(data[start : start + block_chars] + _pack_u64(previous))
        append(previous)
    return hashes


class PrefixIndex:
    """Which servers hold which block hashes: ``hash → servers`` plus one LRU of hashes per server.

    Evicting a hash from a server's LRU removes the server from that hash's holders. Each server has a slot
    number and a hash's holders are a bitmask of slots (an int), so the walk in ``match`` is integer ANDs and
    the index holds no per-hash containers for the garbage collector to scan. Not thread-safe.
    """

    __slots__ = ("_free_slots", "_holders", "_lrus", "_server_of_slot", "_slot_of")

    def __init__(self) -> None:
        self._holders: dict[int, int] = {}  # block hash → bitmask of server slots
        self._lrus: dict[str, OrderedDict[int, None]] = {}
        self._slot_of: dict[str, int] = {}
        self._server_of_slot: dict[int, str] = {}
        self._free_slots: list[int] = []

    def __len__(self) -> int:
        """Total (server, hash) entries."""
        return sum(len(lru) for lru in self._lrus.values())

    @property
    def servers(self) -> list[str]:
        return list(self._lrus)

    @property
    def distinct_blocks(self) -> int:
        """Block hashes held by at least one server."""
        return len(self._holders)

    def server_size(self, server: str) -> int:
        lru = self._lrus.get(server)
        return 0 if lru is None else len(lru)

    def holders(self, block_hash: int) -> frozenset[str]:
        return frozenset(self._servers_in(self._holders.get(block_hash, 0)))

    def insert(self, server: str, hashes: list[int], capacity: int) -> None:
        """Record that ``server`` holds ``hashes``, then evict its least recently used beyond ``capacity``.

        The leading blocks go in last, so they are the most recently used (see the module docstring).
        """
        lru = self._lrus.get(server)
        if lru is None:
            lru = self._lrus[server] = OrderedDict()
            slot = self._free_slots.pop() if self._free_slots else len(self._slot_of)
            self._slot_of[server] = slot
            self._server_of_slot[slot] = server
        bit = 1 << self._slot_of[server]
        holders = self._holders
        for block_hash in reversed(hashes):
            if block_hash in lru:
                lru.move_to_end(block_hash)
            else:
                lru[block_hash] = None
                holders[block_hash] = holders.get(block_hash, 0) | bit
        for _ in range(len(lru) - max(capacity, 1)):
            evicted, _ = lru.popitem(last=False)
            self._forget(evicted, bit)

    def match(self, hashes: list[int]) -> dict[str, int]:
        """Per server, how many leading blocks of ``hashes`` it holds (servers holding none are absent)."""
        if not hashes:
            return {}
        holders = self._holders
        alive = holders.get(hashes[0], 0)
        if not alive:
            return {}
        matched: dict[str, int] = {}
        depth = 1
        for block_hash in hashes[1:]:
            survivors = alive & holders.get(block_hash, 0)
            if survivors != alive:
                for server in self._servers_in(alive & ~survivors):
                    matched[server] = depth
                if not survivors:
                    return matched
                alive = survivors
            depth += 1
        for server in self._servers_in(alive):
            matched[server] = depth
        return matched

    def remove_server(self, server: str) -> None:
        lru = self._lrus.pop(server, None)
        if lru is None:
            return
        slot = self._slot_of.pop(server)
        del self._server_of_slot[slot]
        bit = 1 << slot
        for block_hash in lru:
            self._forget(block_hash, bit)
        self._free_slots.append(slot)

    def retain_servers(self, keep: Iterable[str]) -> list[str]:
        """Drop every server not in ``keep``; returns the dropped ones."""
        keep_set = set(keep)
        dropped = [server for server in self._lrus if server not in keep_set]
        for server in dropped:
            self.remove_server(server)
        return dropped

    def _servers_in(self, mask: int) -> list[str]:
        server_of_slot = self._server_of_slot
        servers = []
        while mask:
            lowest = mask & -mask
            servers.append(server_of_slot[lowest.bit_length() - 1])
            mask ^= lowest
        return servers

    def _forget(self, block_hash: int, bit: int) -> None:
        mask = self._holders.get(block_hash, 0) & ~bit
        if mask:
            self._holders[block_hash] = mask
        else:
            self._holders.pop(block_hash, None)


class ApproxPrefixCacheParams(PluginParams):
    auto_tune: bool = Field(True, alias="autoTune")
    block_size_tokens: int = Field(16, alias="blockSizeTokens", gt=0)
    max_prefix_blocks_to_match: int = Field(256, alias="maxPrefixBlocksToMatch", gt=0)
    max_prefix_tokens_to_match: int = Field(0, alias="maxPrefixTokensToMatch", ge=0)
    lru_capacity_per_server: int = Field(31_250, alias="lruCapacityPerServer", gt=0)
    index_responses: bool = Field(True, alias="indexResponses")
    deprecated_block_size_chars: int | None = Field(None, alias="blockSize")

    @model_validator(mode="after")
    def _no_char_block_size_alone(self) -> ApproxPrefixCacheParams:
        if self.deprecated_block_size_chars is not None and "block_size_tokens" not in self.model_fields_set:
            raise ValueError("blockSize (in characters) is no longer supported: set blockSizeTokens instead")
        return self


@dataclass(slots=True)
class PrefixRequestState:
    """What ``produce`` leaves in ``request.state`` for ``pre_request`` (and for observability)."""

    hashes: list[int]
    block_size_tokens: int
    prompt_bytes: int = 0  # UTF-8 length of the prompt text
    matched: dict[str, int] = field(default_factory=dict)  # server address → leading blocks held
    pool: PoolState | None = None


@register_plugin(default_producer=True)
class ApproxPrefixCacheProducer(Plugin, DataProducer, PreRequest, ResponseBodyProcessor):
    """Attaches each candidate's prefix match (in blocks) and records dispatched requests (and, with
    ``indexResponses``, their replies) in the index."""

    type_name = "approx-prefix-cache-producer"
    Params = ApproxPrefixCacheParams
    params: ApproxPrefixCacheParams
    produces: ClassVar[tuple[str, ...]] = (PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS, PREFIX_BLOCK_SIZE_TOKENS)

    def __init__(self, name: str, params: ApproxPrefixCacheParams, ctx: PluginContext) -> None:
        super().__init__(name, params, ctx)
        self.index = PrefixIndex()
        self.state_key = f"prefix-cache:{self.name}"
        self._seeds: dict[tuple[str, str], int] = {}

    # --- DataProducer ---------------------------------------------------------------------------------
    def produce(self, request: InferenceRequest, candidates: Candidates) -> None:
        block_tokens = self._block_size_tokens(candidates.column("block_size"))
        state = self._request_state(request, block_tokens)
        state.pool = candidates.pool
        state.matched = matched = self.index.match(state.hashes)
        n = len(candidates)
        match_blocks = np.zeros(n, dtype=np.int64)
        if matched:
            pool = candidates.pool
            candidate_of_position = {p: i for i, p in enumerate(candidates.positions.tolist())}
            for server, blocks in matched.items():
                if server in pool:
                    i = candidate_of_position.get(pool.position(server))
                    if i is not None:
                        match_blocks[i] = blocks
        # np.empty + fill: np.full costs twice as much on arrays this small.
        total_blocks = np.empty(n, dtype=np.int64)
        total_blocks.fill(len(state.hashes))
        block_size = np.empty(n, dtype=np.int64)
        block_size.fill(block_tokens)
        attrs = candidates.attrs
        attrs[PREFIX_MATCH_BLOCKS] = match_blocks
        attrs[PREFIX_TOTAL_BLOCKS] = total_blocks
        attrs[PREFIX_BLOCK_SIZE_TOKENS] = block_size

    # --- PreRequest -----------------------------------------------------------------------------------
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> PreRequestResult | None:
        state: PrefixRequestState | None = request.state.get(self.state_key)
        pool = self.ctx.pool if self.ctx.pool is not None else (state.pool if state else None)
        if state is None:  # the producer did not run for this request
            reported = pool.columns["block_size"] if pool is not None else np.zeros(0, dtype=np.int64)
            state = self._request_state(request, self._block_size_tokens(reported))
        if not state.hashes:
            return None
        # Before the insert: what the target held of this prompt, for the in-flight prefill accounting.
        held = state.matched.get(result.target.address, 0)
        # The share of hashed blocks, even for a prompt longer than the hashed cap: its tail is usually the
        # same shared context (counting it uncached made b2b-saas' TTFT MAPE 0.15 → 0.38 in the benchmark).
        cached_prompt_tokens = request.prompt_tokens * held // len(state.hashes)
        targets = [result.target]
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.targets and prefill.targets[0] != result.target:
            targets.append(prefill.targets[0])
        for endpoint in targets:
            self.index.insert(endpoint.address, state.hashes, self._lru_capacity(endpoint.address, pool))
        return PreRequestResult(cached_prompt_tokens=cached_prompt_tokens)

    # --- ResponseBodyProcessor ------------------------------------------------------------------------
    def reply_chars_wanted(self, request: InferenceRequest) -> int:
        """As much of the reply as the hashed prefix has room for after the prompt."""
        state: PrefixRequestState | None = request.state.get(self.state_key)
        if state is None or not self.params.index_responses:
            return 0
        block_chars = state.block_size_tokens * CHARS_PER_TOKEN
        hashed_chars = self._max_blocks(state.block_size_tokens) * block_chars
        return max(0, hashed_chars - state.prompt_bytes)

    def on_response_body(
        self, request: InferenceRequest, response: ResponseInfo, *, start_of_stream: bool, end_of_stream: bool
    ) -> None:
        if not end_of_stream or response.error is not None or not response.history_text:
            return
        state: PrefixRequestState | None = request.state.get(self.state_key)
        if state is None or not self.params.index_responses:
            return
        hashes = self._history_hashes(request, state, _utf8(response.history_text))
        if hashes and hashes != state.hashes:
            address = response.endpoint.address
            pool = self.ctx.pool if self.ctx.pool is not None else state.pool
            self.index.insert(address, hashes, self._lru_capacity(address, pool))

    # --- housekeeping ---------------------------------------------------------------------------------
    def drop_departed_servers(self, pool: PoolState | None = None) -> list[str]:
        """Forget servers that are no longer in the pool (the original does this every 2 minutes)."""
        pool = pool if pool is not None else self.ctx.pool
        if pool is None:
            raise ValueError("no pool to compare the index with")
        return self.index.retain_servers(endpoint.address for endpoint in pool.endpoints)

    # --- helpers --------------------------------------------------------------------------------------
    def _block_size_tokens(self, reported_block_sizes: np.ndarray) -> int:
        """With autoTune, the first candidate's reported block size (the first that reports one)."""
        if self.params.auto_tune and len(reported_block_sizes):
            first = int(reported_block_sizes[0])
            if first > 0:
                return first
            known = np.flatnonzero(reported_block_sizes > 0)
            if len(known):
                return int(reported_block_sizes[known[0]])
        return self.params.block_size_tokens

    def _history_hashes(
        self, request: InferenceRequest, state: PrefixRequestState, history: bytes
    ) -> list[int]:
        """Block hashes of the history, reusing the prompt's hashes of the full blocks it shares with it."""
        block_chars = state.block_size_tokens * CHARS_PER_TOKEN
        prompt = _utf8(request.prompt_text)
        shared = len(prompt) // block_chars
        # A chat history differs from the prompt's JSON at its closing bracket: at most one block back.
        if shared and not history.startswith(prompt[: shared * block_chars]):
            shared -= 1
            if shared and not history.startswith(prompt[: shared * block_chars]):
                shared = 0
        shared = min(shared, len(state.hashes))
        seed = state.hashes[shared - 1] if shared else self._seed(request.target_model, request.cache_salt)
        max_blocks = self._max_blocks(state.block_size_tokens)
        if not shared and len(history) < block_chars:
            return []
        return state.hashes[:shared] + _chain_hashes(
            history[shared * block_chars :], seed, block_chars, max_blocks - shared
        )

    def _max_blocks(self, block_tokens: int) -> int:
        if self.params.max_prefix_tokens_to_match > 0:
            return self.params.max_prefix_tokens_to_match // block_tokens
        return self.params.max_prefix_blocks_to_match

    def _request_state(self, request: InferenceRequest, block_tokens: int) -> PrefixRequestState:
        state: PrefixRequestState | None = request.state.get(self.state_key)
        if state is not None and state.block_size_tokens == block_tokens:
            return state
        prompt = _utf8(request.prompt_text)
        hashes = prefix_block_hashes(
            prompt,
            self._seed(request.target_model, request.cache_salt),
            block_tokens * CHARS_PER_TOKEN,
            self._max_blocks(block_tokens),
        )
        state = PrefixRequestState(hashes=hashes, block_size_tokens=block_tokens, prompt_bytes=len(prompt))
        request.state[self.state_key] = state
        return state

    def _seed(self, model: str, cache_salt: str) -> int:
        key = (model, cache_salt)
        seed = self._seeds.get(key)
        if seed is None:
            if len(self._seeds) >= 4096:  # cache salts can be per user: keep the memo bounded
                self._seeds.clear()
            seed = self._seeds[key] = prefix_seed(model, cache_salt)
        return seed

    def _lru_capacity(self, address: str, pool: PoolState | None) -> int:
        if self.params.auto_tune and pool is not None and address in pool:
            gpu_blocks = int(pool.value(address, "num_gpu_blocks"))
            if gpu_blocks > 0:
                return gpu_blocks
        return self.params.lru_capacity_per_server


@register_plugin
class PrefixCacheScorer(Plugin, ListScorer):
    """Fraction of the request's prompt blocks the candidate already holds: matched / total (0 if unknown)."""

    type_name = "prefix-cache-scorer"
    consumes: ClassVar[tuple[str, ...]] = (PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS)

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        return prefix_match_ratio(candidates)

    def score_list(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> list[float]:
        return prefix_match_ratio_list(candidates)


def prefix_match_ratio(candidates: Candidates) -> np.ndarray:
    """matched / total prefix blocks per candidate; 0 where the producer's data is missing or total is 0."""
    matched = candidates.attrs.get(PREFIX_MATCH_BLOCKS)
    total = candidates.attrs.get(PREFIX_TOTAL_BLOCKS)
    if matched is None or total is None:
        return np.zeros(len(candidates))
    return matched / np.maximum(total, 1)  # matched ≤ total, so total 0 gives 0


def prefix_match_ratio_list(candidates: Candidates) -> list[float]:
    """``prefix_match_ratio`` in plain Python (the same float64 division, so the same results)."""
    matched = candidates.attrs.get(PREFIX_MATCH_BLOCKS)
    total = candidates.attrs.get(PREFIX_TOTAL_BLOCKS)
    if matched is None or total is None:
        return [0.0] * len(candidates)
    # np.maximum(t, 1) keeps NaN; numpy divides the operands as float64.
    return [
        float(m) / float(t if t >= 1 or t != t else 1)
        for m, t in zip(matched.tolist(), total.tolist(), strict=True)
    ]
