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

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
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
from slorouter.scheduling.plugins.prefix.index import PrefixIndex
from slorouter.scheduling.prefix_blocks import (
    CHARS_PER_TOKEN,
    chain_hashes,
    prefix_block_hashes,
    prefix_match_ratio,
    prefix_match_ratio_list,
    prefix_seed,
    utf8_bytes,
)
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest, SchedulingResult

PREFILL_PROFILE = "prefill"  # the disaggregation profile whose target also gets the request's blocks


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
    # A hedged copy's targets: recorded in the index at its first token, not at its dispatch.
    deferred: list[str] = field(default_factory=list)
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
        if request.hedge_copy:
            state.deferred = [endpoint.address for endpoint in targets]
        else:
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
        if request.hedge_copy and (start_of_stream or end_of_stream):
            self._copy_answered(request, response)
        if not end_of_stream or not response.succeeded or not response.history_text:
            return
        state: PrefixRequestState | None = request.state.get(self.state_key)
        if state is None or not self.params.index_responses:
            return
        hashes = self._history_hashes(request, state, utf8_bytes(response.history_text))
        if hashes and hashes != state.hashes:
            address = response.endpoint.address
            pool = self.ctx.pool if self.ctx.pool is not None else state.pool
            self.index.insert(address, hashes, self._lru_capacity(address, pool))

    def _copy_answered(self, request: InferenceRequest, response: ResponseInfo) -> None:
        """A hedge's copy is recorded where it went only once it answers: most copies lose the race while
        they still queue there, before computing anything. Recorded at their dispatch, they sent the next
        requests of the prefix to a cache that never held it, and their insert evicted entries the
        endpoint's LRU really held."""
        state: PrefixRequestState | None = request.state.get(self.state_key)
        if state is None or not state.deferred:
            return
        targets, state.deferred = state.deferred, []
        if response.first_token_at is None:  # it lost (or failed) before it answered
            return
        pool = self.ctx.pool if self.ctx.pool is not None else state.pool
        for address in targets:
            self.index.insert(address, state.hashes, self._lru_capacity(address, pool))

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
        prompt = utf8_bytes(request.prompt_text)
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
        return state.hashes[:shared] + chain_hashes(
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
        prompt = utf8_bytes(request.prompt_text)
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
