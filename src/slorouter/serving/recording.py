"""Recording the traffic a front-end serves (``--record FILE``), for ``slorouter bench --trace``.

One JSON line per inference request once it is answered, with no prompt or completion text: when it
arrived, its API, token counts, SLO headers, objective and priority, streaming, and what happened (status,
endpoint, route, TTFT, TPOT). The prompt is kept only as **block hashes**: the prompt text as the router's
prefix index reads it (the plain prompt of a completion, the messages' JSON of a chat completion), UTF-8,
cut into blocks of ``BLOCK_BYTES`` (16 tokens of the router's estimate) and hashed as the prefix index
chains them (xxhash64 of each block with the hash before it, the model name and ``cache_salt`` starting the
chain); then every hash goes through SipHash-2-4 keyed with a secret drawn when the recording starts and
never written (``serving.keyed_hash``). Two requests share a leading run of equal hashes exactly where their
prompts share a prefix (and model and salt), and the hashes say nothing else: without the key, a guessed
text cannot be checked against them, and two recordings' hashes never match.

Each file starts with a header line naming the format, the recording (a random id: hashes compare only
within one recording) and the block size. docs/replay.md describes the format.

The request path pays for a tuple and a deque append (``RecordFile.add``); hashing and JSON run on the
writer's thread.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from slorouter.api.routing_headers import OBJECTIVE_HEADERS
from slorouter.clock import Clock
from slorouter.config import ConfigError
from slorouter.director import RequestLifecycle
from slorouter.scheduling.plugin import TargetPrediction
from slorouter.scheduling.prefix_blocks import prefix_block_hashes, prefix_seed
from slorouter.scheduling.types import InferenceRequest
from slorouter.serving.keyed_hash import siphash24
from slorouter.serving.record_file import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, RecordFile
from slorouter.tokenizer import BYTES_PER_TOKEN

FORMAT = "slorouter-trace"
VERSION = 1
BLOCK_TOKENS = 16  # the simulated engine's KV block and the router's prefix-index block
BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN
# The inference routes by the ``api`` field they record.
API_NAMES = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,10})')


@dataclass(frozen=True, slots=True)
class RecordSettings:
    """``--record FILE``, ``--record-max-bytes``, ``--record-backups``."""

    path: Path
    max_bytes: int = DEFAULT_MAX_BYTES
    backups: int = DEFAULT_BACKUPS


class RecordError(ConfigError):
    """The recording's file cannot be opened (a front-end's command exits 2 with the message)."""


class _Pending(NamedTuple):
    """What the request path hands the writer: references only, nothing computed."""

    arrival: float  # wall-clock seconds
    api: str
    request: InferenceRequest
    status: int
    endpoint: str | None
    route: str | None
    ttft_ms: float | None
    tpot_ms: float | None
    output_tokens: int | None
    body: bytes | None  # a whole response body, read for its usage on the writer's thread, never written
    prediction: TargetPrediction | None = None  # on the endpoint that served it, when routed by prediction


class TrafficRecorder:
    """Records answered requests to a rotating JSON Lines file (``serving.record_file``)."""

    def __init__(self, settings: RecordSettings, clock: Clock, *, interval_s: float = 0.2) -> None:
        self._clock = clock
        self._key = secrets.token_bytes(16)
        self.recording = secrets.token_hex(8)
        self.file: RecordFile[_Pending] = RecordFile(
            settings.path,
            self._encode,
            self._header,
            max_bytes=settings.max_bytes,
            backups=settings.backups,
            interval_s=interval_s,
        )

    def open(self) -> None:
        """Open the file and start writing; ``RecordError`` when it cannot be opened."""
        try:
            self.file.open()
        except OSError as exc:
            raise RecordError(f"--record {self.file.path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        """Write what is pending and close the file."""
        self.file.close()

    # --- the request path ----------------------------------------------------------------------------
    def answered(self, lifecycle: RequestLifecycle, path: str, body: bytes | None = None) -> None:
        """A dispatched request's response ended (whatever its status); ``body``: the whole response, when
        the front-end has it (its ``usage`` gives the output tokens of a response that was not streamed)."""
        request = lifecycle.request
        response = lifecycle.response
        ttft_ms = tpot_ms = None
        if response.first_token_at is not None and response.succeeded:
            ttft_ms = (response.first_token_at - request.received_at) * 1000
            if response.streaming and response.tokens > 1 and response.completed_at is not None:
                tpot_ms = (response.completed_at - response.first_token_at) * 1000 / (response.tokens - 1)
        completion = (response.usage or {}).get("completion_tokens")
        if not isinstance(completion, int) or isinstance(completion, bool) or completion < 0:
            completion = response.tokens if response.tokens and response.succeeded else None
        self.file.add(
            _Pending(
                self._wall(request.received_at),
                API_NAMES.get(path, path),
                request,
                response.status,
                response.endpoint.address,
                lifecycle.route.value,
                ttft_ms,
                tpot_ms,
                completion,
                body if completion is None else None,
                lifecycle.prediction,
            )
        )

    def unanswered(
        self, request: InferenceRequest, path: str, status: int, endpoint: str | None = None
    ) -> None:
        """A parsed request the router answered itself: shed, rejected by flow control, no endpoint, or
        every endpoint tried failed before answering (``endpoint``: the last one tried)."""
        arrival = self._wall(request.received_at)
        self.file.add(
            _Pending(
                arrival, API_NAMES.get(path, path), request, status, endpoint, None, None, None, None, None
            )
        )

    def _wall(self, at: float) -> float:
        """The wall-clock time of the clock's ``at``."""
        return time.time() - (self._clock.now() - at)

    # --- the writer's thread -------------------------------------------------------------------------
    def _header(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "recording": self.recording,
                "block_tokens": BLOCK_TOKENS,
                "started": round(time.time(), 3),
            },
            separators=(",", ":"),
        )

    def _encode(self, batch: list[_Pending]) -> list[str]:
        chains = []
        for pending in batch:
            chains.append(_chain(pending.request))
            time.sleep(0)  # hand the GIL back between requests: the event loop never waits long for it
        keyed = self._keyed(chains)
        return [
            json.dumps(_record(pending, hashes), separators=(",", ":"))
            for pending, hashes in zip(batch, keyed, strict=True)
        ]

    def block_hashes(self, request: InferenceRequest) -> list[int]:
        """The recorded hashes of one request's prompt."""
        return self._keyed([_chain(request)])[0]

    def _keyed(self, chains: list[list[int]]) -> list[list[int]]:
        """Every chain's values through SipHash-2-4 under the recording's key, in one numpy pass."""
        flat = np.fromiter(
            itertools.chain.from_iterable(chains), dtype=np.uint64, count=sum(map(len, chains))
        )
        values = siphash24(flat, self._key).tolist()
        out = []
        start = 0
        for chain in chains:
            out.append(values[start : start + len(chain)])
            start += len(chain)
        return out


def _chain(request: InferenceRequest) -> list[int]:
    """The prefix index's hash chain (xxhash64, ``scheduling.plugins.prefix``) over the prompt's whole
    blocks: at most ``prompt_tokens // BLOCK_TOKENS`` of them, so that a replayed prompt holds every one."""
    data = request.prompt_text.encode("utf-8", "surrogatepass")
    blocks = min(len(data) // BLOCK_BYTES, request.prompt_tokens // BLOCK_TOKENS)
    seed = prefix_seed(request.target_model, request.cache_salt)
    return prefix_block_hashes(data[: blocks * BLOCK_BYTES], seed, BLOCK_BYTES, blocks)


def _record(pending: _Pending, hashes: list[int]) -> dict[str, Any]:
    request = pending.request
    return {
        "arrival": round(pending.arrival, 6),
        "api": pending.api,
        "prompt_tokens": request.prompt_tokens,
        "max_tokens": request.max_tokens,
        "output_tokens": _output_tokens(pending),
        "stream": request.stream,
        "slo_ttft_ms": request.slo_ttft_ms,
        "slo_tpot_ms": request.slo_tpot_ms,
        "objective": _objective(request.headers),
        "priority": request.priority,
        "status": pending.status,
        "endpoint": pending.endpoint,
        "route": pending.route,
        "ttft_ms": None if pending.ttft_ms is None else round(pending.ttft_ms, 3),
        "tpot_ms": None if pending.tpot_ms is None else round(pending.tpot_ms, 3),
        **_predicted(pending.prediction),
        "block_hashes": hashes,
    }


def _predicted(prediction: TargetPrediction | None) -> dict[str, float | None]:
    """The prediction routing used for the endpoint (the models' quantile, from the dispatch, without the
    live-coverage factor of the served figures): what the prediction ledger pairs with the outcome."""
    if prediction is None:
        return {"predicted_ttft_ms": None, "predicted_tpot_ms": None}
    tpot = prediction.model_tpot_ms
    return {
        "predicted_ttft_ms": round(prediction.model_ttft_ms, 3),
        "predicted_tpot_ms": None if tpot is None else round(tpot, 3),
    }


def _output_tokens(pending: _Pending) -> int | None:
    """Output tokens the response reported or streamed; from a whole body, its ``usage``."""
    if pending.output_tokens is not None or not pending.body:
        return pending.output_tokens
    return completion_tokens_in(pending.body)


def completion_tokens_in(body: bytes) -> int | None:
    """``usage.completion_tokens`` of a whole (non-streamed) response body, found without parsing it."""
    match = _COMPLETION_TOKENS.search(body, max(body.rfind(b'"usage"'), 0))
    return int(match.group(1)) if match else None


def _objective(headers: dict[str, str]) -> str | None:
    for name in OBJECTIVE_HEADERS:
        value = headers.get(name)
        if value is not None:
            return value.strip()
    return None
