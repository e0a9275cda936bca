"""The block hashes a pod gives a request's prompt, for ``precise-prefix-cache-producer``.

Two kinds of pod:

- ``sim``: ``slorouter sim``'s servers. Token ids from ``slorouter.tokenizer`` (chat messages through its
  template), hashed with ``slorouter.kvevents.sim_hash``.
- ``vllm``: real vLLM pods. Token ids from the model's own tokenizer and chat template
  (``slorouter.hftokenizer``), hashed as vLLM hashes them (``slorouter.kvevents.vllm_hash``) with the pods'
  algorithm and ``PYTHONHASHSEED``, a LoRA adapter's name and path and the request's ``cache_salt`` in the
  extra keys.

``PodHashing.prompt(request)`` returns the request's hasher, a function of the pod's block size, or None when
the prompt cannot be tokenized as the pod would (then the producer keeps the approximate estimate).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from slorouter.api.replies import CHAT
from slorouter.hftokenizer.model import ModelTokenizer
from slorouter.kvevents import sim_hash
from slorouter.kvevents.vllm_hash import ExtraKeys, VllmBlockHasher
from slorouter.scheduling.types import InferenceRequest
from slorouter.tokenizer import chat_to_prompt, encode_bytes

PromptHashes = Callable[[int], list[int]]  # block size → the prompt's full-block hashes


class PodHashing(Protocol):
    def prompt(self, request: InferenceRequest) -> PromptHashes | None: ...


def _chat_messages(request: InferenceRequest) -> Any:
    """The messages of a chat request (``prompt_text`` is their JSON), or None for a completion."""
    if request.history_form != CHAT:
        return None
    try:
        return json.loads(request.prompt_text)
    except ValueError:
        return None


def pod_token_bytes(request: InferenceRequest) -> bytes:
    """The prompt's token ids as the simulated server computes them (packed little-endian uint32)."""
    messages = _chat_messages(request)
    if messages is not None:
        try:
            return encode_bytes(chat_to_prompt(messages))
        except (ValueError, TypeError):  # not the messages JSON the API layer writes: hash the text
            pass
    return encode_bytes(request.prompt_text)


class SimPodHashing:
    """``slorouter sim``'s tokenizer and hash chain."""

    def prompt(self, request: InferenceRequest) -> PromptHashes:
        tokens = pod_token_bytes(request)
        return lambda block_size: sim_hash.block_hashes(tokens, block_size)


class VllmPodHashing:
    """A vLLM pod's tokenizer and hash chain; ``lora_adapters`` maps adapter names to the paths the pods
    loaded them from (``--lora-modules name=path``)."""

    def __init__(
        self, tokenizer: ModelTokenizer, hasher: VllmBlockHasher, lora_adapters: Mapping[str, str]
    ) -> None:
        self.tokenizer = tokenizer
        self.hasher = hasher
        self.lora_adapters = dict(lora_adapters)

    def token_ids(self, request: InferenceRequest) -> list[int] | None:
        """The prompt's token ids as the pod computes them, or None if it cannot be done here."""
        messages = _chat_messages(request)
        try:
            if messages is not None:
                if not isinstance(messages, list):
                    return None
                return self.tokenizer.chat_token_ids(messages)
            if request.history_form == CHAT:
                return None
            return self.tokenizer.encode(request.prompt_text)
        except (ValueError, TypeError):
            return None

    def extra_keys(self, request: InferenceRequest) -> ExtraKeys:
        path = self.lora_adapters.get(request.target_model)
        return ExtraKeys(None if path is None else (request.target_model, path), request.cache_salt)

    def prompt(self, request: InferenceRequest) -> PromptHashes | None:
        tokens = self.token_ids(request)
        if tokens is None:
            return None
        extra = self.extra_keys(request)
        return lambda block_size: self.hasher.block_hashes(tokens, block_size, extra)
