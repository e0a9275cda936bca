"""The OpenAI-compatible wire format of the simulated server: request validation and response bodies.

Validation follows vLLM's OpenAI server: a missing ``model`` means the served model, an unknown one is a
404 ``NotFoundError``, every other bad input a 400 ``BadRequestError`` with vLLM's messages where it has
them. Errors have OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from slorouter.sim.text import PERIOD, TOKEN_JSON, output_text
from slorouter.tokenizer import chat_to_prompt, encode_array

COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's and OpenAI's default for /v1/completions
# vLLM lets a chat reply run to the context length and relies on EOS; the simulator has no EOS.
CHAT_DEFAULT_MAX_TOKENS = 256
_UINT32_MAX = 2**32 - 1


class ApiError(Exception):
    """An error answered to the client as an OpenAI error body."""

    def __init__(
        self, message: str, *, status: int = 400, type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}
        }


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated completion or chat-completion request."""

    chat: bool
    model: str
    prompt_ids: np.ndarray  # uint32 token ids
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: int = 0  # vLLM's request priority (lower first)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ApiError(f"Invalid JSON in the request body: {exc}") from None


def parse_generation(
    body: Any, *, chat: bool, served_model: str, max_model_len: int, priority_scheduling: bool = False
) -> GenerationRequest:
    """Validate a /v1/completions (``chat=False``) or /v1/chat/completions body; raises ``ApiError``.

    ``priority`` (vLLM's extra field, default 0) must be an integer; a server without priority scheduling
    (``priority_scheduling`` false: vLLM's default ``--scheduling-policy fcfs``) refuses any other than 0,
    with vLLM's message.
    """
    if not isinstance(body, Mapping):
        raise ApiError("The request body must be a JSON object.")
    model = body.get("model")
    if model is None:
        model = served_model
    elif not isinstance(model, str):
        raise ApiError("model must be a string.", param="model")
    elif model != served_model:
        raise ApiError(
            f"The model `{model}` does not exist.", status=404, type="NotFoundError", param="model"
        )

    prompt_ids = _chat_prompt(body) if chat else _completion_prompt(body)
    prompt_len = len(prompt_ids)
    if prompt_len == 0:
        raise ApiError("The prompt cannot be empty.", param="prompt")
    if prompt_len >= max_model_len:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            param="messages" if chat else "prompt",
        )

    max_tokens = _max_tokens(body, chat, max_model_len - prompt_len)
    if prompt_len + max_tokens > max_model_len:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="max_tokens",
        )

    stream = body.get("stream")
    if stream is None:
        stream = False
    elif not isinstance(stream, bool):
        raise ApiError("stream must be a boolean.", param="stream")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise ApiError("Stream options can only be defined when `stream=True`.", param="stream_options")
        if not isinstance(options, Mapping):
            raise ApiError("stream_options must be an object.", param="stream_options")
        include_option = options.get("include_usage")
        if include_option is None:
            include_usage = False
        elif isinstance(include_option, bool):
            include_usage = include_option
        else:
            raise ApiError("stream_options.include_usage must be a boolean.", param="stream_options")

    n = body.get("n")
    if n is not None and n != 1:
        raise ApiError("The simulator supports only n=1.", param="n")
    priority = body.get("priority")
    if priority is None:
        priority = 0
    elif type(priority) is not int:
        raise ApiError("priority must be an integer.", param="priority")
    elif priority != 0 and not priority_scheduling:
        raise ApiError(f"Got priority {priority} but Priority scheduling is not enabled.", param="priority")
    return GenerationRequest(chat, model, prompt_ids, max_tokens, stream, include_usage, priority)


def _completion_prompt(body: Mapping[str, Any]) -> np.ndarray:
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError("Field required: prompt.", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return encode_array(prompt)
    if isinstance(prompt, list):
        if not all(type(token) is int and 0 <= token <= _UINT32_MAX for token in prompt):
            if any(isinstance(item, str | list) for item in prompt):
                raise ApiError("The simulator accepts one prompt per request, not a batch.", param="prompt")
            raise ApiError("Token ids in prompt must be integers in [0, 2**32).", param="prompt")
        return np.array(prompt, dtype="<u4")
    raise ApiError("prompt must be a string, a list of token ids, or a list of one of these.", param="prompt")


def _chat_prompt(body: Mapping[str, Any]) -> np.ndarray:
    messages = body.get("messages")
    if messages is None:
        raise ApiError("Field required: messages.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list.", param="messages")
    try:
        return encode_array(chat_to_prompt(messages))
    except ValueError as exc:
        raise ApiError(f"Invalid messages: {exc}.", param="messages") from None


def _max_tokens(body: Mapping[str, Any], chat: bool, room: int) -> int:
    param = "max_tokens"
    value = body.get("max_tokens")
    if chat and body.get("max_completion_tokens") is not None:
        param, value = "max_completion_tokens", body["max_completion_tokens"]
    if value is None:
        return COMPLETION_DEFAULT_MAX_TOKENS if not chat else max(1, min(CHAT_DEFAULT_MAX_TOKENS, room))
    if type(value) is not int:
        raise ApiError(f"{param} must be an integer.", param=param)
    if value < 1:
        raise ApiError(f"{param} must be at least 1, got {value}.", param=param)
    return value


# ------------------------------------------------------------------------------------------- responses


def new_request_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + os.urandom(16).hex()


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def response_body(
    request: GenerationRequest, request_id: str, created: int, completion_tokens: int, cached_tokens: int
) -> dict[str, Any]:
    """The non-streaming response."""
    text = output_text(0, completion_tokens)
    if request.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        kind = "text_completion"
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": request.model,
        "choices": [choice],
        "usage": usage(request.prompt_tokens, completion_tokens, cached_tokens),
    }


def response_json(
    request: GenerationRequest, request_id: str, created: int, completion_tokens: int, cached_tokens: int
) -> bytes:
    """``json.dumps(response_body(...)).encode()``, byte for byte, from a template.

    Every simulated request ends here; serialising the nested dict costs several times more than filling
    in a template whose only free-form strings (model, text) are escaped by ``json.dumps`` itself.
    """
    text = json.dumps(output_text(0, completion_tokens))
    prompt_tokens = request.prompt_tokens
    if request.chat:
        choice = (
            f'{{"index": 0, "message": {{"role": "assistant", "content": {text}, "tool_calls": []}}, '
            '"logprobs": null, "finish_reason": "length", "stop_reason": null}'
        )
        kind = "chat.completion"
    else:
        choice = (
            f'{{"index": 0, "text": {text}, '
            '"logprobs": null, "finish_reason": "length", "stop_reason": null}'
        )
        kind = "text_completion"
    return (
        f'{{"id": {json.dumps(request_id)}, "object": "{kind}", "created": {created}, '
        f'"model": {json.dumps(request.model)}, "choices": [{choice}], "usage": {{"prompt_tokens": '
        f'{prompt_tokens}, "total_tokens": {prompt_tokens + completion_tokens}, "completion_tokens": '
        f'{completion_tokens}, "prompt_tokens_details": {{"cached_tokens": {cached_tokens}}}}}}}'
    ).encode()


class SseWriter:
    """Builds the SSE byte chunks of one streamed response: one chunk per token, then usage and [DONE]."""

    __slots__ = ("_chat", "_head", "_model_json", "_request", "_sent")

    def __init__(self, request: GenerationRequest, request_id: str, created: int) -> None:
        self._request = request
        self._chat = request.chat
        kind = "chat.completion.chunk" if request.chat else "text_completion"
        self._head = (
            f'data: {{"id":"{request_id}","object":"{kind}","created":{created},'
            f'"model":{json.dumps(request.model)},"choices":'
        )
        self._sent = 0

    @property
    def sent(self) -> int:
        return self._sent

    def tokens(self, count: int) -> bytes:
        """The chunks of the next ``count`` tokens (the chat stream opens with the assistant role)."""
        head = self._head
        last = self._request.max_tokens - 1
        parts = []
        if self._chat and self._sent == 0 and count:
            parts.append(
                head + '[{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]}\n\n'
            )
        for k in range(self._sent, self._sent + count):
            reason = '"length"' if k == last else "null"
            token = TOKEN_JSON[k % PERIOD]
            if self._chat:
                parts.append(
                    f'{head}[{{"index":0,"delta":{{"content":{token}}},"logprobs":null,'
                    f'"finish_reason":{reason}}}]}}\n\n'
                )
            else:
                parts.append(
                    f'{head}[{{"index":0,"text":{token},"logprobs":null,"finish_reason":{reason},'
                    f'"stop_reason":null}}]}}\n\n'
                )
        self._sent += count
        return "".join(parts).encode()

    def usage(self, cached_tokens: int) -> bytes:
        body = json.dumps(
            usage(self._request.prompt_tokens, self._sent, cached_tokens), separators=(",", ":")
        )
        return f'{self._head}[],"usage":{body}}}\n\n'.encode()

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"


def created_now() -> int:
    return int(time.time())
