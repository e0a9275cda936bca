"""The simulated model's output: one fixed passage, repeated, cut into 4-byte tokens.

Output token ``k`` of every request is the ``k``-th 4-character piece of the repeated passage, so a reply of
``n`` tokens is exactly ``4·n`` ASCII characters and ``tokenizer.encode(reply)`` gives back the very token ids
the engine generated. Sent back as an assistant message in the next chat turn (which ``chat_to_prompt``
starts on a token boundary), the reply therefore hits the prefix cache like a real model's would.
"""

from __future__ import annotations

import json

from slorouter.tokenizer import BYTES_PER_TOKEN

_BASE = (
    "This reply was written by the slorouter model-server simulator. It stands in for a real model so "
    "that routing, batching and caching can be measured without a GPU. Every word costs the same as a "
    "real token would, and the text repeats after a while. "
)
PASSAGE = _BASE + " " * (-len(_BASE) % BYTES_PER_TOKEN)  # ASCII, a whole number of tokens

PERIOD = len(PASSAGE) // BYTES_PER_TOKEN  # tokens before the passage repeats
TOKEN_TEXTS: tuple[str, ...] = tuple(
    PASSAGE[i : i + BYTES_PER_TOKEN] for i in range(0, len(PASSAGE), BYTES_PER_TOKEN)
)
# JSON string literals of the tokens (quotes included), for building SSE chunks without json.dumps per token.
TOKEN_JSON: tuple[str, ...] = tuple(json.dumps(text) for text in TOKEN_TEXTS)

_PASSAGE_BYTES = PASSAGE.encode("ascii")
_TWICE = _PASSAGE_BYTES * 2


def output_text(start: int, stop: int) -> str:
    """Text of output tokens ``start`` (inclusive) to ``stop`` (exclusive)."""
    return output_bytes(start, stop).decode("ascii")


def output_bytes(start: int, stop: int) -> bytes:
    """Bytes of output tokens ``start`` to ``stop`` (also their packed token ids: ids are the bytes)."""
    if stop <= start:
        return b""
    offset = (start % PERIOD) * BYTES_PER_TOKEN
    length = (stop - start) * BYTES_PER_TOKEN
    if offset + length <= len(_TWICE):
        return _TWICE[offset : offset + length]
    repeats = (offset + length) // len(_PASSAGE_BYTES) + 1
    return (_PASSAGE_BYTES * repeats)[offset : offset + length]
