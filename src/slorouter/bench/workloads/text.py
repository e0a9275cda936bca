"""Cheap, token-aligned prompt text.

Every piece of text a generator builds is ASCII and exactly ``4·n`` characters for ``n`` tokens, so
pieces concatenate on token boundaries: two prompts that share their leading pieces share their leading
token ids, the engine's 16-token blocks and the router's 64-character blocks alike. A piece starts with a
tag naming what it belongs to (group, session, turn), so distinct pieces differ from their first token
on and, both block hashes being chained, everything after them differs too.
"""

from __future__ import annotations

from slorouter.sim.text import output_text
from slorouter.tokenizer import BYTES_PER_TOKEN

_WORDS = (
    "Filler prompt text for the slorouter benchmark: it stands for a document, a system prompt or "
    "a question of a given length, costs one token per four characters and repeats as needed. "
)
_FILLER_UNIT = _WORDS + " " * (-len(_WORDS) % BYTES_PER_TOKEN)
_filler = _FILLER_UNIT * 64


def _filler_chars(count: int) -> str:
    global _filler
    if count > len(_filler):
        _filler = _FILLER_UNIT * (count // len(_FILLER_UNIT) + 1)
    return _filler[:count]


def tag(text: str) -> str:
    """``[text]`` padded with spaces to a whole number of tokens."""
    label = f"[{text}]"
    return label + " " * (-len(label) % BYTES_PER_TOKEN)


def piece(label: str, tokens: int) -> str:
    """``tokens`` tokens of text starting with ``label`` (cut short if the piece is shorter than it)."""
    chars = max(0, tokens) * BYTES_PER_TOKEN
    if chars <= len(label):
        return label[:chars]
    return label + _filler_chars(chars - len(label))


def reply(tokens: int) -> str:
    """The simulated model's reply of ``tokens`` tokens, exactly as the simulator generates it."""
    return output_text(0, tokens)


def tokens_of(text: str) -> int:
    """Tokens of a generator-built (ASCII, token-aligned) text."""
    return len(text) // BYTES_PER_TOKEN
