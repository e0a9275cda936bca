"""The router's window of recent traffic: what the tuner replays in its twin of the pool.

One entry per answered request, with the fields of a ``--record`` line (``serving.recording``) and no text:
arrival, token counts, the prompt's prefix block hashes, SLO headers, priority, streaming, and what happened
(status, endpoint, TTFT, TPOT), plus the profile that routed it and the pod's scraped queue at the end (from
which the tuner learns each pod's batch cap). The hashes are the prefix index's chain over the prompt's
blocks of ``BLOCK_TOKENS`` tokens; they stay in memory (a dump for the tuner's process is written to a
private temporary file), so they are not keyed as a recording's are.

Bounded twice: by age (``span_s``, measured from the newest entry) and by count (``max_entries``). The
request path pays for hashing the prompt's whole blocks (xxhash64, a few microseconds for a 4k-token prompt)
and a deque append.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from slorouter.director import RequestLifecycle
from slorouter.scheduling.prefix_blocks import prefix_block_hashes, prefix_seed
from slorouter.serving.recording import completion_tokens_in
from slorouter.tokenizer import BYTES_PER_TOKEN

BLOCK_TOKENS = 16  # as a recording's (serving.recording.BLOCK_TOKENS)
BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN
DEFAULT_SPAN_S = 300.0
DEFAULT_MAX_ENTRIES = 200_000


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """One answered request, as the window keeps it."""

    arrival: float  # the router's clock, seconds
    prompt_tokens: int
    max_tokens: int | None
    output_tokens: int  # streamed or reported; 0 when the request failed before any
    block_hashes: tuple[int, ...]
    stream: bool
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    priority: int
    status: int
    endpoint: str
    profile: str  # the scheduling profile that picked the endpoint
    ttft_ms: float | None  # None unless it succeeded
    tpot_ms: float | None  # None unless it succeeded, streamed, with two tokens or more
    waiting: float  # the endpoint's scraped queue when the response ended (0: never scraped)
    running: float


class TrafficWindow:
    """Recent answered requests, oldest first, bounded by age and count."""

    def __init__(self, *, span_s: float = DEFAULT_SPAN_S, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if not span_s > 0 or max_entries < 1:
            raise ValueError(f"span_s must be > 0 and max_entries >= 1 (got {span_s}, {max_entries})")
        self.span_s = span_s
        self._entries: deque[WindowEntry] = deque(maxlen=max_entries)
        # For the switch guard, which cannot wait for whole answers: when each picked request arrived, and
        # the arrival and TTFT of each first token (a request picked and without one is still waiting).
        self._picked: deque[float] = deque(maxlen=max_entries)
        self._first_tokens: deque[tuple[float, float]] = deque(maxlen=max_entries)

    def __len__(self) -> int:
        return len(self._entries)

    def answered(
        self, lifecycle: RequestLifecycle, waiting: float, running: float, body: bytes | None = None
    ) -> None:
        """Keep a request whose response ended (whatever its status); ``body``: the whole response, when the
        front-end read it (the output tokens of a response that was not streamed are in its ``usage``)."""
        request = lifecycle.request
        response = lifecycle.response
        output_tokens = response.tokens
        if not output_tokens and body:
            output_tokens = completion_tokens_in(body) or 0
        ttft_ms = tpot_ms = None
        if response.succeeded and response.first_token_at is not None:
            ttft_ms = (response.first_token_at - request.received_at) * 1000.0
            if response.streaming and response.tokens > 1 and response.completed_at is not None:
                tpot_ms = (response.completed_at - response.first_token_at) * 1000.0 / (response.tokens - 1)
        data = request.prompt_text.encode("utf-8", "surrogatepass")
        blocks = min(len(data) // BLOCK_BYTES, request.prompt_tokens // BLOCK_TOKENS)
        hashes = prefix_block_hashes(
            data[: blocks * BLOCK_BYTES],
            prefix_seed(request.target_model, request.cache_salt),
            BLOCK_BYTES,
            blocks,
        )
        entry = WindowEntry(
            arrival=request.received_at,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            output_tokens=output_tokens,
            block_hashes=tuple(hashes),
            stream=request.stream,
            slo_ttft_ms=request.slo_ttft_ms,
            slo_tpot_ms=request.slo_tpot_ms,
            priority=request.priority,
            status=response.status,
            endpoint=response.endpoint.address,
            profile=lifecycle.result.primary_profile,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
            waiting=waiting if math.isfinite(waiting) else 0.0,
            running=running if math.isfinite(running) else 0.0,
        )
        entries = self._entries
        entries.append(entry)
        horizon = entry.arrival - self.span_s
        while entries and entries[0].arrival < horizon:
            entries.popleft()

    def picked(self, arrival: float) -> None:
        """A request that arrived at ``arrival`` was picked an endpoint (its first attempt)."""
        picked = self._picked
        picked.append(arrival)
        horizon = arrival - self.span_s
        while picked and picked[0] < horizon:
            picked.popleft()

    def first_token(self, arrival: float, ttft_ms: float) -> None:
        """The first token of the request that arrived at ``arrival`` reached the router."""
        firsts = self._first_tokens
        firsts.append((arrival, ttft_ms))
        horizon = arrival - self.span_s
        while firsts and firsts[0][0] < horizon:
            firsts.popleft()

    def ttfts(self, start: float, end: float) -> tuple[int, list[float]]:
        """Of the requests picked that arrived in [start, end): how many, and the TTFTs (ms) of those whose
        first token came."""
        count = sum(1 for a in self._picked if start <= a < end)
        return count, [t for a, t in self._first_tokens if start <= a < end]

    def entries(self, since: float | None = None) -> list[WindowEntry]:
        """The entries (arrived at or after ``since``), in the order they were answered."""
        if since is None:
            return list(self._entries)
        return [e for e in self._entries if e.arrival >= since]


_ENTRIES = msgspec.json.Decoder(list[WindowEntry])


def encode_entries(entries: Sequence[WindowEntry]) -> bytes:
    """The entries as JSON (the file a router hands its tuner's process)."""
    return msgspec.json.encode(list(entries))


def decode_entries(data: bytes) -> list[WindowEntry]:
    """``encode_entries``'s output back; ``msgspec.ValidationError`` for anything else."""
    return _ENTRIES.decode(data)
