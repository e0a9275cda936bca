"""What a request list looks like: counts, length percentiles and the prefix reuse it offers a cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import xxhash

from slorouter.bench.workloads.request import BenchRequest
from slorouter.sim.text import output_bytes
from slorouter.tokenizer import BYTES_PER_TOKEN, count_tokens

BLOCK_TOKENS = 16  # the simulated engine's KV block
_BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN
_hash = xxhash.xxh64_intdigest


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    requests: int
    rate: float  # requests per second over the span from 0 to the last arrival
    prompt_tokens_mean: float
    prompt_tokens_p50: float
    prompt_tokens_p99: float
    prompt_tokens_max: int
    output_tokens_mean: float
    output_tokens_p50: float
    output_tokens_p99: float
    multi_turn_share: float  # share of requests that belong to a multi-turn session
    sessions: int  # distinct multi-turn sessions
    prefix_reuse: float  # share of prompt tokens in whole blocks an earlier request already had
    sheddable_share: float
    clipped: int
    dropped: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _block_hashes(data: bytes) -> list[int]:
    """Chained hashes of the full 64-byte (16-token) blocks of ``data``."""
    hashes = []
    previous = 0
    for start in range(0, len(data) - _BLOCK_BYTES + 1, _BLOCK_BYTES):
        previous = _hash(data[start : start + _BLOCK_BYTES], previous)
        hashes.append(previous)
    return hashes


def prefix_reuse(requests: Sequence[BenchRequest]) -> float:
    """Share of prompt tokens that repeat, in whole 16-token blocks, a prefix of an earlier request.

    An earlier request's prefix spans its prompt and its generated output (the engine caches the blocks of
    both), so a multi-turn history counts as reused. Like the engine, at most ``prompt_tokens - 1`` tokens
    of a prompt can be served from cache. This is an upper bound of the prefix-cache hit rate: a cache of
    unlimited size, every earlier request finished and all on one server.
    """
    seen: set[int] = set()
    total = reused = 0
    for request in requests:
        prompt = request.prompt.encode("utf-8", "surrogatepass")
        tokens = count_tokens(request.prompt)
        total += tokens
        hashes = _block_hashes(prompt + output_bytes(0, request.max_tokens))
        hits = 0
        for block_hash in hashes[: (tokens - 1) // BLOCK_TOKENS]:
            if block_hash not in seen:
                break
            hits += 1
        reused += hits * BLOCK_TOKENS
        seen.update(hashes)
    return reused / total if total else 0.0


def summarize(requests: Sequence[BenchRequest]) -> WorkloadSummary:
    """Summary of a request list (``clipped``/``dropped`` are read from a ``WorkloadRequests``)."""
    count = len(requests)
    prompts = np.array([count_tokens(r.prompt) for r in requests], dtype=np.float64)
    outputs = np.array([r.max_tokens for r in requests], dtype=np.float64)
    sessions = {r.session for r in requests if r.session >= 0}
    last = requests[-1].arrival if count else 0.0

    def stat(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if count else 0.0

    return WorkloadSummary(
        requests=count,
        rate=count / last if last > 0 else 0.0,
        prompt_tokens_mean=float(prompts.mean()) if count else 0.0,
        prompt_tokens_p50=stat(prompts, 50),
        prompt_tokens_p99=stat(prompts, 99),
        prompt_tokens_max=int(prompts.max()) if count else 0,
        output_tokens_mean=float(outputs.mean()) if count else 0.0,
        output_tokens_p50=stat(outputs, 50),
        output_tokens_p99=stat(outputs, 99),
        multi_turn_share=sum(r.session >= 0 for r in requests) / count if count else 0.0,
        sessions=len(sessions),
        prefix_reuse=prefix_reuse(requests),
        sheddable_share=sum(r.priority < 0 for r in requests) / count if count else 0.0,
        clipped=getattr(requests, "clipped", 0),
        dropped=getattr(requests, "dropped", 0),
    )
