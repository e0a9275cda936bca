"""The conversation history a response creates, for the prefix index (``ResponseInfo.history_text``).

A client continuing a conversation sends the reply back: a completions client appends it to its prompt, a
chat client appends ``{"role": "assistant", "content": reply}`` to its messages. The history text is that
next prompt's start in the form the gateway hashes (``ParsedRequest.prompt_text``): the prompt followed by
the reply, or for chat the messages' compact JSON with the assistant message appended. Only the first
``wanted`` characters of the reply are collected (the prefix index hashes a bounded prefix), so a long
reply costs nothing once that budget is reached.
"""

from __future__ import annotations

import json
import re

# The C string decoder behind json.loads; typeshed does not list it, though json.decoder has exported it
# since Python 2.6.
from json.decoder import scanstring  # type: ignore[attr-defined]

import orjson

CHAT = "chat"
TEXT = "text"
_CHAT_TEXT = re.compile(r'"content":\s*"')
_COMPLETION_TEXT = re.compile(r'"text":\s*"')


class ReplyCollector:
    """Collects the reply text from an OpenAI SSE stream (chunks split anywhere), up to a budget.

    Runs once per streamed chunk, so it does not parse the events: it finds each chunk's ``"content"``
    (chat) or ``"text"`` (completions) string and decodes just that, with the JSON scanner's C string
    decoder. Requests with several choices (``n`` > 1) are not collected (``ParsedRequest.history_form``).
    """

    __slots__ = ("_key", "_parts", "_pending", "_size", "_wanted", "form")

    def __init__(self, form: str, wanted: int) -> None:
        self.form = form
        self._key = _CHAT_TEXT if form == CHAT else _COMPLETION_TEXT
        self._wanted = wanted
        self._parts: list[str] = []
        self._size = 0
        self._pending = b""

    @property
    def full(self) -> bool:
        return self._size >= self._wanted

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def feed(self, chunk: bytes) -> None:
        if self._size >= self._wanted:
            return
        data = self._pending + chunk if self._pending else chunk
        # JSON strings hold no raw newline, so everything up to the last one is whole events.
        end = data.rfind(b"\n") + 1
        self._pending = data[end:]
        if not end:
            return
        events = data[:end].decode("utf-8", "replace")
        for match in self._key.finditer(events):
            try:
                text = scanstring(events, match.end())[0]
            except ValueError:  # not a well-formed JSON string: not ours to read
                continue
            if text:
                self._parts.append(text)
                self._size += len(text)


def reply_from_body(body: bytes, form: str) -> str | None:
    """The reply of choice 0 in a whole (non-streaming) response body, or None."""
    try:
        response = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list):
        return None
    choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
    if choice is None:
        return None
    if form == CHAT:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    return text if isinstance(text, str) else None


def history_text(prompt_text: str, reply: str, form: str) -> str:
    """What the next turn's prompt text starts with (see the module docstring)."""
    if form == CHAT:
        if not prompt_text.endswith("]"):
            return ""
        content = json.dumps(reply, ensure_ascii=False)
        return f'{prompt_text[:-1]},{{"role":"assistant","content":{content}}}'
    return prompt_text + reply
