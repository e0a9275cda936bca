"""A trace as a benchmark workload: its requests at its own times, with prompts that share prefixes exactly
where the trace's blocks are equal.

Every distinct block key of the trace (a recording's hash, a Mooncake ``hash_id``) gets its own text of
``block_tokens`` tokens, deterministic and token-aligned (``text.piece``: a tag naming the block, then
filler), and a request's prompt is its blocks' texts in order, then, up to its ``prompt_tokens``, text of its
own. So two replayed prompts share their leading characters, token ids, the engine's 16-token blocks and the
router's prefix-index blocks for as long as their traces' block keys agree, and differ from the first
block on where they do not (a block whose key differs starts with a different tag). A last block shorter
than ``block_tokens`` (Mooncake's partial block) is the start of its key's text, so it is shared too. A
trace without blocks (Azure's) gives prompts that share nothing.

``speed`` divides the arrival times (2 = twice the rate); ``duration_s`` keeps the requests that arrive
before it. A request longer than ``max_model_len`` keeps the start of its prompt (so what it shares stays
shared) and its output length; one whose output alone does not leave room for a prompt token is dropped.
Both are counted, as the generated workloads count theirs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable
from dataclasses import dataclass

from slorouter.bench.workloads.request import BenchRequest, WorkloadRequests
from slorouter.bench.workloads.text import piece, tag
from slorouter.bench.workloads.trace_formats import Trace
from slorouter.tokenizer import BYTES_PER_TOKEN

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Replay:
    requests: WorkloadRequests
    duration_s: float  # the measured window's end: past the last kept arrival
    qps: float  # the replay's mean rate over the duration


def replay(
    trace: Trace,
    *,
    speed: float = 1.0,
    duration_s: float | None = None,
    max_model_len: int | None = None,
) -> Replay:
    """The trace's requests as a workload (see the module's description)."""
    if not (math.isfinite(speed) and speed > 0):
        raise ValueError(f"speed must be a positive number, got {speed!r}")
    name = f"trace-{trace.path.stem}"
    blocks = BlockTexts(trace.block_tokens)
    kept: list[BenchRequest] = []
    clipped = dropped = 0
    for index, entry in enumerate(trace.entries):
        arrival = entry.arrival / speed
        if duration_s is not None and arrival >= duration_s:
            break
        prompt_tokens = max(entry.prompt_tokens, 1)  # the simulator needs a prompt token and
        output_tokens = max(entry.output_tokens, 1)  # generates at least one
        if max_model_len is not None and prompt_tokens + output_tokens > max_model_len:
            if output_tokens >= max_model_len:
                dropped += 1
                continue
            prompt_tokens = max_model_len - output_tokens
            clipped += 1
        kept.append(
            BenchRequest(
                arrival=arrival,
                prompt=blocks.prompt(entry.blocks, prompt_tokens, index),
                max_tokens=output_tokens,
                slo_ttft_ms=entry.slo_ttft_ms,
                slo_tpot_ms=entry.slo_tpot_ms,
                priority=entry.priority,
            )
        )
    if clipped or dropped:
        log.info(
            "%s: %d request(s) clipped and %d dropped to fit max_model_len=%s",
            name,
            clipped,
            dropped,
            max_model_len,
        )
    if not kept:
        raise ValueError(f"{trace.path}: no request of the trace is left to replay (duration, max_model_len)")
    if duration_s is None:
        # Just past the last arrival, on a whole millisecond, so that the last request is measured too.
        duration_s = math.floor(kept[-1].arrival * 1000 + 1) / 1000
    requests = WorkloadRequests(name, kept, clipped=clipped, dropped=dropped)
    return Replay(requests, duration_s, len(kept) / duration_s)


class BlockTexts:
    """The text of every block key, numbered in order of first use."""

    def __init__(self, block_tokens: int) -> None:
        self._block_tokens = block_tokens
        self._ids: dict[Hashable, int] = {}

    def prompt(self, keys: tuple[Hashable, ...], tokens: int, request: int) -> str:
        """``tokens`` tokens: the blocks of ``keys`` (the last one possibly cut short), then the request's
        own text."""
        parts = []
        left = tokens
        for key in keys:
            if left <= 0:
                break
            block = self._ids.setdefault(key, len(self._ids))
            size = min(self._block_tokens, left)
            parts.append(piece(tag(f"block {block}"), size))
            left -= size
        if left > 0:
            parts.append(piece(_own_label(request), left))
        return "".join(parts)


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _own_label(request: int) -> str:
    """A request's own text starts with ``#`` and three digits of its index in base 62, so that even one
    token of it differs between requests (for 238,328 requests in a row), then names the request."""
    code = "".join(_DIGITS[request // 62**power % 62] for power in (2, 1, 0))
    label = f"#{code} request {request}"
    return label + " " * (-len(label) % BYTES_PER_TOKEN)
