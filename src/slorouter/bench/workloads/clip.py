"""Fitting requests into the model's context (``max_model_len``).

A request whose prompt plus ``max_tokens`` exceeds ``max_model_len`` keeps its head (the tag and system
or shared prompt it opened with) and the newest part of the rest: the oldest history after the head is
cut out, as a chat client that truncates its context would do, so the head still hits the prefix cache.
The output length is never changed. A request that cannot fit even so (``max_tokens`` plus its head
leaves no room for one more token) is dropped. Both are counted in the result's ``clipped``/``dropped``.
"""

from __future__ import annotations

from slorouter.tokenizer import BYTES_PER_TOKEN


def clip(prompt: str, head_chars: int, max_tokens: int, max_model_len: int | None) -> str | None:
    """``prompt`` fitted into ``max_model_len`` (the same object when it fits), or ``None`` to drop it."""
    if max_model_len is None:
        return prompt
    tokens = len(prompt) // BYTES_PER_TOKEN
    if tokens + max_tokens <= max_model_len:
        return prompt
    keep = max_model_len - max_tokens - head_chars // BYTES_PER_TOKEN  # tokens kept after the head
    if keep < 1:
        return None
    return prompt[:head_chars] + prompt[len(prompt) - keep * BYTES_PER_TOKEN :]
