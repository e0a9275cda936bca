"""From an OpenAI request (path, body, headers) to the ``InferenceRequest`` the Director schedules: the
same parsing and validation in every front-end."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable

from slorouter.api.requests import ParsedRequest, parse_chat_completion, parse_completion
from slorouter.api.routing_headers import RoutingHints
from slorouter.scheduling.types import InferenceRequest

# The inference routes and their body parsers (each raises ``RequestError`` naming the problem).
INFERENCE_PARSERS: dict[str, Callable[[bytes], ParsedRequest]] = {
    "/v1/completions": parse_completion,
    "/v1/chat/completions": parse_chat_completion,
}


class RequestIds:
    """Request ids for requests that came without ``x-request-id``: unique per process start."""

    def __init__(self) -> None:
        self._ids = itertools.count()
        self._prefix = f"slr-{os.getpid():x}-{time.time_ns() & 0xFFFFFF:x}-"

    def next(self) -> str:
        return f"{self._prefix}{next(self._ids)}"


def inference_request(
    parsed: ParsedRequest,
    hints: RoutingHints,
    headers: dict[str, str],
    request_id: str,
    received_at: float,
) -> InferenceRequest:
    """The scheduler's view of one parsed request (``headers``: lower-case names)."""
    return InferenceRequest(
        request_id=request_id,
        model=parsed.model,
        prompt_text=parsed.prompt_text,
        prompt_tokens=parsed.prompt_tokens,
        max_tokens=parsed.max_tokens,
        stream=parsed.stream,
        headers=headers,
        cache_salt=parsed.cache_salt,
        received_at=received_at,
        priority=hints.priority,
        objective=hints.objective or "",
        slo_ttft_ms=hints.slo_ttft_ms,
        slo_tpot_ms=hints.slo_tpot_ms,
        use_prediction=hints.use_prediction,
        history_form=parsed.history_form,
    )
