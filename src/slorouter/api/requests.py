"""Parsing and validation of OpenAI-compatible request bodies.

The gateway forwards the client's body bytes unchanged (but for the engine priority,
``slorouter.serving.engine_priority``); it parses them only to validate and to learn what the scheduler needs
(model, prompt text for prefix matching, token estimates, streaming).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slorouter.api.replies import CHAT, TEXT
from slorouter.http.errors import RequestError
from slorouter.tokenizer import chat_to_prompt, count_tokens

# What the OpenAI API does when max_tokens is omitted: completions default to 16 tokens; chat completions
# run to the end of the context, so the router budgets a typical answer for its load accounting.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CHAT_ASSUMED_MAX_TOKENS = 256
# The largest token limit (and ``n``) taken: far beyond any context length, and small enough that the
# in-flight token sums of the pool's int64 columns cannot overflow.
MAX_TOKENS_LIMIT = 2**31 - 1
MAX_TOKEN_ID = 2**32 - 1  # token ids are unsigned 32-bit integers (the simulator's and vLLM's)


@dataclass(slots=True)
class ParsedRequest:
    model: str
    prompt_text: str  # what the prefix index hashes
    prompt_tokens: int
    max_tokens: int
    stream: bool
    cache_salt: str
    history_form: str = (
        ""  # how a reply continues prompt_text (gateway.history): chat, text, or "" (it cannot)
    )
    client_priority: bool = False  # the body has a top-level "priority" (the engine's, when it is sent)


def check_content_type(content_type: str | None) -> None:
    """``RequestError`` (415) unless the body is declared JSON (``application/json``, ``*/*+json``) or not
    declared at all, as vLLM's server (FastAPI) takes it: a form or text body is refused, not parsed."""
    if content_type is None:
        return
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return
    raise RequestError(
        f"Content-Type {content_type.strip()!r} is not supported: send the body as JSON with "
        "Content-Type: application/json",
        param="content-type",
        status=415,
    )


def _require_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{key}' must be an integer, got {type(value).__name__}", param=key)
    if value < 1:
        raise RequestError(f"'{key}' must be at least 1, got {value}", param=key)
    if value > MAX_TOKENS_LIMIT:
        raise RequestError(f"'{key}' must be at most {MAX_TOKENS_LIMIT}, got {value}", param=key)
    return value


def _common(body: Any) -> tuple[str, bool, str, bool]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise RequestError("'model' is required and must be a non-empty string", param="model")
    if not model.isascii() and not _encodable(model):  # it would be a metric label, written as UTF-8
        raise RequestError("'model' must be valid Unicode text; it holds a lone surrogate", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be a boolean, got {type(stream).__name__}", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    salt = body.get("cache_salt", "")
    if salt is None:
        salt = ""
    if not isinstance(salt, str):
        raise RequestError("'cache_salt' must be a string", param="cache_salt")
    return model, stream, salt, "priority" in body


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _prompt_text(prompt: Any) -> tuple[str, int, str]:
    """Text, token count and history form of a completions prompt: a string, a list of strings, or token
    ids (only a single string prompt has a reply that continues it)."""
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("'prompt' must not be empty", param="prompt")
        return prompt, count_tokens(prompt), TEXT
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            if not all(prompt):
                raise RequestError("'prompt' must not hold an empty string", param="prompt")
            text = "".join(prompt)
            return text, sum(count_tokens(p) for p in prompt), ""  # a batch: no one conversation
        if _token_ids(prompt):
            return " ".join(map(str, prompt)), len(prompt), ""
        if all(isinstance(p, list) and p and _token_ids(p) for p in prompt):  # a batch of token-id lists
            return " ".join(str(t) for p in prompt for t in p), sum(map(len, prompt)), ""
    raise RequestError(
        "'prompt' is required and must be a non-empty string, list of strings, list of token ids or list "
        f"of lists of token ids (integers from 0 to {MAX_TOKEN_ID})",
        param="prompt",
    )


def _token_ids(items: list[Any]) -> bool:
    return all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in items)


def _single_choice(body: dict[str, Any], form: str) -> str:
    """``form``, unless the request asks for several choices (no single reply continues the prompt)."""
    return form if _require_int(body, "n") in (None, 1) else ""


def parse_completion(raw: bytes) -> ParsedRequest:
    body = _decode(raw)
    model, stream, salt, client_priority = _common(body)
    text, tokens, form = _prompt_text(body.get("prompt"))
    max_tokens = _require_int(body, "max_tokens") or COMPLETIONS_DEFAULT_MAX_TOKENS
    history_form = _single_choice(body, form)
    return ParsedRequest(model, text, tokens, max_tokens, stream, salt, history_form, client_priority)


def parse_chat_completion(raw: bytes) -> ParsedRequest:
    body = _decode(raw)
    model, stream, salt, client_priority = _common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' is required and must be a non-empty array", param="messages")
    text_only = [_text_only(i, message) for i, message in enumerate(messages)]
    limit = _require_int(body, "max_completion_tokens")
    limit = limit or _require_int(body, "max_tokens") or CHAT_ASSUMED_MAX_TOKENS
    try:
        rendered = chat_to_prompt(text_only)
    except (TypeError, ValueError, KeyError) as exc:
        raise RequestError(f"'messages' could not be read: {exc}", param="messages") from exc
    # The prefix index hashes the messages' JSON, as the original EPP does, so prefixes follow turns.
    prompt_text = json.dumps(messages, separators=(",", ":"), ensure_ascii=False)
    history_form = _single_choice(body, CHAT)
    tokens = count_tokens(rendered)
    return ParsedRequest(model, prompt_text, tokens, limit, stream, salt, history_form, client_priority)


def _text_only(i: int, message: Any) -> Any:
    """``messages[i]`` validated, as the token estimate reads it: its text parts only (an image, audio,
    file or refusal part is valid, but its tokens are the model server's to count)."""
    if not isinstance(message, dict):
        raise RequestError(f"messages[{i}] must be an object", param="messages")
    if not isinstance(message.get("role"), str):
        raise RequestError(f"messages[{i}].role is required and must be a string", param="messages")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return message
    if not isinstance(content, list):
        raise RequestError(
            f"messages[{i}].content must be a string, an array of parts or null", param="messages"
        )
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise RequestError(
                f"messages[{i}].content[{j}] must be an object with a string 'type'", param="messages"
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise RequestError(f"messages[{i}].content[{j}] is a text part without a string 'text'",
                               param="messages")  # fmt: skip
    if all(part["type"] == "text" for part in content):
        return message
    return {**message, "content": [part for part in content if part["type"] == "text"]}


def _decode(raw: bytes) -> Any:
    if not raw:
        raise RequestError("the request body is empty; a JSON object is required")
    try:
        return json.loads(raw)
    except ValueError as exc:  # not JSON, not UTF-8, or an integer beyond Python's 4,300 digits
        raise RequestError(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise RequestError("the request body is not valid JSON: nested too deeply") from None
