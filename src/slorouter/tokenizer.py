"""The simulated model's tokenizer: every 4 bytes of UTF-8 text is one token.

Real BPE tokenizers average about 4 characters per token on English text; this one makes that exact and
position-based, which buys three properties the simulator and the router rely on:

- **Prefix stability.** Two texts sharing their first ``n`` bytes share their first ``n // 4`` token ids, so
  the engine's prefix cache (hash chain over 16-token blocks, i.e. 64 bytes of text) hits exactly where the
  texts agree, and the router's approximate prefix index (64-character blocks) sees the same boundaries.
- **Stable ids.** A token id is the little-endian ``uint32`` value of its 4 bytes (the last chunk is padded
  with NUL bytes), so ids are identical across processes and machines, and distinct chunks never collide.
  No salted ``hash()`` is involved.
- **Speed.** ``count_tokens`` is ``ceil(bytes / 4)``: O(1) for ASCII text (``str.isascii`` reads a flag),
  one ``str.encode`` otherwise. The router calls it on its hot path.

Non-ASCII text costs more tokens per character (CJK: about 1.3 characters per token), as with real
tokenizers.

``chat_to_prompt`` renders OpenAI chat messages with a Llama-3-like template whose pieces are each padded to
a 4-byte boundary. Because of that, a message's content always starts on a token boundary, so the tokens of
an assistant reply the simulator generated (4 bytes each) reappear verbatim in the next turn's prompt, and the
engine's prefix cache hits on them the way vLLM's does on multi-turn conversations.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

BYTES_PER_TOKEN = 4
_TOKEN_DTYPE = np.dtype("<u4")

BEGIN_OF_TEXT = "<|begin_of_text|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
END_OF_TURN = "<|eot_id|>"


def utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (lone surrogates count as 3 bytes, as ``surrogatepass`` encodes them)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def count_tokens(text: str) -> int:
    """Number of tokens ``encode(text)`` returns, without building them."""
    return (utf8_length(text) + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN


def encode_bytes(text: str) -> bytes:
    """The packed token ids of ``text`` (UTF-8, zero-padded to whole tokens), as the engine takes them."""
    data = text.encode("utf-8", "surrogatepass")
    tail = len(data) % BYTES_PER_TOKEN
    if tail:
        data += b"\0" * (BYTES_PER_TOKEN - tail)
    return data


def encode_array(text: str) -> np.ndarray:
    """Token ids as a read-only ``uint32`` array (no per-token Python objects; the engine accepts it)."""
    return np.frombuffer(encode_bytes(text), dtype=_TOKEN_DTYPE)


def encode(text: str) -> list[int]:
    """Token ids of ``text``: one per 4 UTF-8 bytes, the id being those bytes as a little-endian uint32."""
    return encode_array(text).tolist()


def token_ids_to_bytes(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Packed little-endian uint32 form of token ids (what the engine hashes). Ids must fit in uint32."""
    if isinstance(token_ids, np.ndarray):
        if token_ids.dtype != _TOKEN_DTYPE:
            if token_ids.size and (token_ids.min() < 0 or token_ids.max() > 0xFFFFFFFF):
                raise ValueError("token ids must be in [0, 2**32)")
            token_ids = token_ids.astype(_TOKEN_DTYPE)
        return token_ids.tobytes()
    packed = array.array("I", token_ids)  # raises OverflowError for ids outside uint32
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def decode(token_ids: Sequence[int] | np.ndarray) -> str:
    """Text of token ids produced by ``encode`` (padding NULs of the last chunk are dropped)."""
    return token_ids_to_bytes(token_ids).rstrip(b"\0").decode("utf-8", "replace")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ValueError('content parts must be objects {"type": "text", "text": "..."}')
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError("message content must be a string, a list of text parts, or null")


def _aligned(piece: str, offset: int, suffix: str = "") -> tuple[str, int]:
    """``piece + spaces + suffix``, with just enough spaces that it ends on a token boundary, and its end."""
    end = offset + utf8_length(piece) + utf8_length(suffix)
    pad = -end % BYTES_PER_TOKEN
    return piece + " " * pad + suffix, end + pad


def chat_to_prompt(messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """Render OpenAI chat messages as one prompt string (Llama-3-like template).

    Each message becomes ``<|start_header_id|>ROLE<|end_header_id|>\\n\\n`` + content + ``<|eot_id|>``, with
    spaces before the header's newlines and after the content so both end on a 4-byte token boundary. With
    ``add_generation_prompt`` the assistant header follows, so the reply starts on a token boundary too.
    Content may be a string, ``None``, or a list of ``{"type": "text", "text": ...}`` parts (concatenated).
    Raises ``ValueError`` on a message that is not an object with a string ``role``.
    """
    pieces = [BEGIN_OF_TEXT]
    offset = utf8_length(BEGIN_OF_TEXT)
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError('each message must be an object with a string "role"')
        header, offset = _aligned(f"{START_HEADER}{message['role']}{END_HEADER}", offset, "\n\n")
        content, offset = _aligned(_content_text(message.get("content")), offset)
        pieces += (header, content, END_OF_TURN)
        offset += len(END_OF_TURN)
    if add_generation_prompt:
        header, offset = _aligned(f"{START_HEADER}assistant{END_HEADER}", offset, "\n\n")
        pieces.append(header)
    return "".join(pieces)
