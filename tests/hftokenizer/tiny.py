"""A tiny word-level tokenizer, written as a model directory (tokenizer.json, tokenizer_config.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, processors

# ChatML, as Qwen's and many fine-tunes' tokenizer_config.json write it.
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Llama 3's shape: bos_token from the config, trimmed content, loop controls, raise_exception.
LLAMA3 = """{{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('unknown role ' + message['role']) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

SPECIAL = [
    "[UNK]",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
WORDS = [
    "system",
    "user",
    "assistant",
    "you",
    "are",
    "a",
    "helpful",
    "the",
    "question",
    "answer",
    "is",
    "what",
    "of",
    "document",
    "section",
    ".",
    ",",
    "?",
    *(f"w{i}" for i in range(200)),
]


def vocabulary() -> dict[str, int]:
    return {token: i for i, token in enumerate([*SPECIAL, *WORDS])}


def build(directory: Path, chat_template: str | None = CHATML, bos: str = "<s>") -> Path:
    """Write the model directory and return it; completions get ``bos`` prepended by the post-processor."""
    vocab = vocabulary()
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {
        "bos_token": {"__type": "AddedToken", "content": bos, "special": True},
        "eos_token": "</s>",
        "unk_token": "[UNK]",
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def words(n: int, offset: int = 0) -> str:
    """``n`` distinct vocabulary words, one token each."""
    return " ".join(f"w{(offset + i) % 200}" for i in range(n))
