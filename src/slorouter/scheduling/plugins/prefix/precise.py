"""Precise prefix-cache affinity from the model servers' own KV events (llm-d's
``precise-prefix-cache-scorer``).

``precise-prefix-cache-producer`` computes, for each candidate that publishes KV events, the block hashes
the pod itself gives the request's prompt (its block size, its hash chain over its tokens) and counts the
leading ones the pod's events say it holds (``KVBlockIndex``, fed by the subscribers or, in the benchmark,
by the simulated engines). For a candidate that publishes nothing, or whose index is not ``exact``
(``slorouter.pool.kv_trust``: a gap not yet replayed, a failed session, late or silent events, a rebuild
after a clear), it keeps the approximate index's estimate: the producer *is* an
``approx-prefix-cache-producer`` (same parameters, same index of what was sent where), and overwrites its
figures where the real ones exist. It writes the same data keys, so
``prefix-cache-scorer``, ``token-load-scorer``, the affinity filter and the latency plugins read the real
cache unchanged; ``prefix_match_from_events`` says which candidates' figures are real.

The pod's hashes (``hash``, ``slorouter.scheduling.plugins.pod_hashing``): with ``sim`` (the default),
``slorouter.kvevents.sim_hash`` over the prompt's token ids as the simulated server tokenizes it, which is
what ``slorouter sim`` publishes; with ``vllm``, vLLM's own block hashes (``slorouter.kvevents.vllm_hash``)
over the ids of the model's tokenizer and chat template (``tokenizer``), with the pods' hash algorithm and
``PYTHONHASHSEED``. A prompt that cannot be tokenized as the pod would (a chat with image parts, a template
that rejects the messages) keeps the approximate estimate.

**Speculative entries** (``speculativeIndexing``): a pod reports a prompt's blocks once it has computed them,
which under load is seconds after the dispatch (the request waits in the pod's queue). Meanwhile the next
request with the same prefix would find it on no pod and go elsewhere, where the approximate index, which
records dispatches, keeps it together. So at dispatch the producer also records the request's blocks in
the index as speculative for its target, and takes them away ``speculativeGraceMs`` after the request's
first token (or its end, if it failed first): by then the pod's own events say what it kept.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar, Literal, get_args

import numpy as np
from pydantic import Field, model_validator

from slorouter.hftokenizer.model import ModelTokenizer
from slorouter.kvevents.vllm_hash import HASH_ALGORITHMS, VllmBlockHasher
from slorouter.scheduling.datakeys import (
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_MATCH_FROM_EVENTS,
    PREFIX_TOTAL_BLOCKS,
)
from slorouter.scheduling.plugin import PluginContext, PreRequestResult, ResponseInfo
from slorouter.scheduling.plugins.prefix.approx import (
    ApproxPrefixCacheParams,
    ApproxPrefixCacheProducer,
    PrefixCacheScorer,
)
from slorouter.scheduling.plugins.prefix.pod_hashing import PodHashing, SimPodHashing, VllmPodHashing
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, InferenceRequest, SchedulingResult

HashAlgorithm = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
assert set(get_args(HashAlgorithm)) == set(HASH_ALGORITHMS)


class PrecisePrefixCacheParams(ApproxPrefixCacheParams):
    speculative_indexing: bool = Field(True, alias="speculativeIndexing")
    speculative_grace_ms: float = Field(1000.0, alias="speculativeGraceMs", ge=0, allow_inf_nan=False)
    hash: Literal["sim", "vllm"] = "sim"
    tokenizer: str | None = None
    chat_template: str | None = Field(None, alias="chatTemplate")
    hash_algorithm: HashAlgorithm = Field("sha256", alias="hashAlgorithm")
    hash_seed: str | None = Field(None, alias="hashSeed")
    lora_adapters: dict[str, str] = Field(default_factory=dict, alias="loraAdapters")

    @model_validator(mode="after")
    def _vllm_needs_a_tokenizer(self) -> PrecisePrefixCacheParams:
        if self.hash == "vllm" and not self.tokenizer:
            raise ValueError("hash: vllm needs tokenizer (a tokenizer.json or a model directory)")
        vllm_only = {"tokenizer", "chat_template", "hash_algorithm", "hash_seed", "lora_adapters"}
        set_here = sorted(vllm_only & self.model_fields_set)
        if self.hash == "sim" and set_here:
            aliases = [type(self).model_fields[f].alias or f for f in set_here]
            raise ValueError(f"{', '.join(aliases)} only apply with hash: vllm")
        return self


def pod_hashing(params: PrecisePrefixCacheParams) -> PodHashing:
    """The pods' tokenizer and hash chain from the parameters; ``ValueError`` naming the parameter and the
    file when the tokenizer or the hash seed cannot be used."""
    if params.hash == "sim":
        return SimPodHashing()
    assert params.tokenizer is not None
    try:
        tokenizer = ModelTokenizer.load(params.tokenizer, params.chat_template)
    except ValueError as exc:
        keys = f"tokenizer {params.tokenizer!r}"
        if params.chat_template:
            keys += f", chatTemplate {params.chat_template!r}"
        raise ValueError(f"{keys}: cannot load: {exc}") from None
    try:
        hasher = VllmBlockHasher(params.hash_algorithm, params.hash_seed)
    except ValueError as exc:
        raise ValueError(f"hashSeed: {exc}") from None
    return VllmPodHashing(tokenizer, hasher, params.lora_adapters)


class PreciseMatch:
    """What ``produce`` leaves for the later hooks: per pod matched from events, its blocks and block size,
    the request's hashes by block size, and the speculative claim made at dispatch."""

    __slots__ = ("block_size", "blocks", "claim", "hashes", "released")

    def __init__(self) -> None:
        self.blocks: dict[str, int] = {}
        self.block_size: dict[str, int] = {}
        self.hashes: dict[int, list[int]] = {}
        self.claim: tuple[str, list[int]] | None = None
        self.released = False


@register_plugin(default_producer=(PREFIX_MATCH_FROM_EVENTS,))
class PrecisePrefixCacheProducer(ApproxPrefixCacheProducer):
    """Each candidate's prefix match from its KV events, or from the approximate index if it has none."""

    type_name = "precise-prefix-cache-producer"
    Params = PrecisePrefixCacheParams
    params: PrecisePrefixCacheParams
    produces: ClassVar[tuple[str, ...]] = (
        PREFIX_MATCH_BLOCKS,
        PREFIX_TOTAL_BLOCKS,
        PREFIX_BLOCK_SIZE_TOKENS,
        PREFIX_MATCH_FROM_EVENTS,
    )

    def __init__(self, name: str, params: PrecisePrefixCacheParams, ctx: PluginContext) -> None:
        super().__init__(name, params, ctx)
        self.precise_key = f"precise-prefix-cache:{self.name}"
        self._releases: deque[tuple[float, str, list[int]]] = deque()  # (when, pod, hashes), in time order
        self.pod_hashing = pod_hashing(params)

    def produce(self, request: InferenceRequest, candidates: Candidates) -> None:
        super().produce(request, candidates)
        self._release_due()
        n = len(candidates)
        from_events = np.zeros(n, dtype=bool)
        candidates.attrs[PREFIX_MATCH_FROM_EVENTS] = from_events
        index = self.ctx.kv_index
        if index is None or not n:
            return
        addresses = [e.address for e in candidates.endpoints]
        by_block_size: dict[int, list[int]] = {}
        reported = candidates.column("block_size").tolist()
        for i, address in enumerate(addresses):
            if index.trusted(address):
                size = index.block_size(address) or int(reported[i]) or self.params.block_size_tokens
                by_block_size.setdefault(size, []).append(i)
        if not by_block_size:
            return
        prompt_hashes = self.pod_hashing.prompt(request)
        if prompt_hashes is None:  # not tokenizable as the pods would: the approximate figures stand
            return
        attrs = candidates.attrs
        match_blocks = attrs[PREFIX_MATCH_BLOCKS] = attrs[PREFIX_MATCH_BLOCKS].copy()
        total_blocks = attrs[PREFIX_TOTAL_BLOCKS] = attrs[PREFIX_TOTAL_BLOCKS].copy()
        block_size = attrs[PREFIX_BLOCK_SIZE_TOKENS] = attrs[PREFIX_BLOCK_SIZE_TOKENS].copy()
        state = PreciseMatch()
        for size, members in by_block_size.items():
            # Every full block: the pod caches them all.
            hashes = state.hashes[size] = prompt_hashes(size)
            matched = index.match(hashes, [addresses[i] for i in members])
            for i in members:
                address = addresses[i]
                match_blocks[i] = state.blocks[address] = matched[address]
                total_blocks[i] = len(hashes)
                block_size[i] = state.block_size[address] = size
                from_events[i] = True
        request.state[self.precise_key] = state

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> PreRequestResult | None:
        approximate = super().pre_request(request, result)  # the approximate index follows every dispatch
        state: PreciseMatch | None = request.state.get(self.precise_key)
        address = result.target.address
        if state is None or address not in state.blocks:
            return approximate
        size = state.block_size[address]
        index = self.ctx.kv_index
        if self.params.speculative_indexing and index is not None and state.hashes[size]:
            state.claim = (address, state.hashes[size])
            index.speculate(address, state.hashes[size])
        cached = min(state.blocks[address] * size, request.prompt_tokens)
        return PreRequestResult(cached_prompt_tokens=cached)

    def on_response_body(
        self, request: InferenceRequest, response: ResponseInfo, *, start_of_stream: bool, end_of_stream: bool
    ) -> None:
        super().on_response_body(
            request, response, start_of_stream=start_of_stream, end_of_stream=end_of_stream
        )
        if not (start_of_stream or end_of_stream):
            return
        state: PreciseMatch | None = request.state.get(self.precise_key)
        if state is None or state.claim is None or state.released:
            return
        state.released = True
        address, hashes = state.claim
        self._releases.append(
            (self.ctx.clock.now() + self.params.speculative_grace_ms / 1000, address, hashes)
        )
        self._release_due()

    def _release_due(self) -> None:
        releases = self._releases
        index = self.ctx.kv_index
        if not releases or index is None:
            return
        now = self.ctx.clock.now()
        while releases and releases[0][0] <= now:
            _, address, hashes = releases.popleft()
            index.unspeculate(address, hashes)


@register_plugin
class PrecisePrefixCacheScorer(PrefixCacheScorer):
    """matched / total prompt blocks per candidate, from ``precise-prefix-cache-producer``."""

    type_name = "precise-prefix-cache-scorer"
    # The marker key first: the loader then auto-creates the precise producer, which writes the other two.
    consumes: ClassVar[tuple[str, ...]] = (PREFIX_MATCH_FROM_EVENTS, PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS)
