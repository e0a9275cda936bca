"""The prompts of the precise prefix cache tests with ``hash: vllm`` (a chat, a salted chat with a LoRA, a
completion) and the tiny model that tokenizes them; ``tests/kvevents/make_vllm_vectors.py`` records vLLM's
hashes of them."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from slorouter.api.replies import CHAT
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.scheduling.plugin import PluginContext
from slorouter.scheduling.plugins.prefix.precise import PrecisePrefixCacheParams, PrecisePrefixCacheProducer
from slorouter.scheduling.types import InferenceRequest
from tests.helpers.scheduling import make_pool, make_request
from tests.hftokenizer import tiny
from tests.kvevents.vllm_vectors import Case

MESSAGES = [
    {"role": "system", "content": "you are a helpful assistant . " + tiny.words(40)},
    {"role": "user", "content": "what is the answer of " + tiny.words(30, 60) + " ?"},
]
COMPLETION = "the document section " + tiny.words(90, 7)
LORA = ("sql-lora", "/adapters/sql")


@functools.cache
def model_dir() -> Path:
    """The tiny model, written once per process (its token ids do not depend on where)."""
    return tiny.build(Path(tempfile.mkdtemp(prefix="slorouter-tiny-")) / "model")


def params(**extra: Any) -> dict[str, Any]:
    return {"hash": "vllm", "tokenizer": str(model_dir()), **extra}


def producer_of(
    pool_size: int = 3, index: KVBlockIndex | None = None, **extra: Any
) -> PrecisePrefixCacheProducer:
    pool = make_pool(pool_size, block_size=[16] * pool_size)
    ctx = PluginContext(rng=np.random.default_rng(0), pool=pool, kv_index=index or KVBlockIndex())
    return PrecisePrefixCacheProducer("p", PrecisePrefixCacheParams.model_validate(params(**extra)), ctx)


def chat_request(**fields: Any) -> InferenceRequest:
    text = json.dumps(MESSAGES, separators=(",", ":"))
    return make_request(text, history_form=CHAT, **fields)


def e2e_cases() -> list[Case]:
    """The prompts of these tests as vLLM pods of the tiny model would hash them."""
    producer = producer_of()
    hashing = producer.pod_hashing
    chat = hashing.token_ids(chat_request())  # type: ignore[attr-defined]
    completion = hashing.token_ids(make_request(COMPLETION))  # type: ignore[attr-defined]
    return [
        Case("e2e-chat", "sha256_cbor", "0", 16, chat),
        Case("e2e-chat-lora-salt", "sha256_cbor", "0", 16, chat, LORA, "tenant-a"),
        Case("e2e-completion", "sha256", None, 16, completion),
    ]
