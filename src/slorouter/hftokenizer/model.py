"""A model's tokenizer loaded from its files: prompt token ids as that model's vLLM pods compute them.

``ModelTokenizer.load(path)`` takes a ``tokenizer.json`` or a model directory holding one. The chat template
comes, in this order, from an explicit template file, the directory's ``chat_template.jinja``, or the
``chat_template`` of ``tokenizer_config.json`` beside the tokenizer (a string, or a list of named templates
of which ``default`` is used). Special tokens for the template come from ``tokenizer_config.json``.

Token ids follow vLLM's OpenAI server: a completion's prompt is encoded with the tokenizer's special tokens
(``add_special_tokens=True``, e.g. a BOS the post-processor adds); a chat's is the rendered template
(``add_generation_prompt=True``) encoded without them, since the template writes its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer

from slorouter.hftokenizer.chat_template import ChatTemplate, special_tokens

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"


class TokenizerLoadError(ValueError):
    """A tokenizer or chat template that cannot be loaded; the message names the file and why."""


class ModelTokenizer:
    """Encodes prompts and chat messages to a model's token ids."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate | None, source: str) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.source = source

    @classmethod
    def load(cls, path: str | Path, chat_template: str | Path | None = None) -> ModelTokenizer:
        """The tokenizer at ``path`` (a ``tokenizer.json`` or a directory with one); ``TokenizerLoadError``
        naming the file if it cannot be read."""
        path = Path(path)
        if not path.exists():
            raise TokenizerLoadError(f"{path}: no such file or directory")
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise TokenizerLoadError(f"{file}: no such tokenizer file")
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust library raises plain Exception
            raise TokenizerLoadError(f"{file}: not a tokenizer.json: {exc}") from None
        config = _read_config(file.parent / CONFIG_FILE)
        source = _template_source(file.parent, config, chat_template)
        template = None
        if source is not None:
            text, origin = source
            try:
                template = ChatTemplate(text, special_tokens(config))
            except jinja2.TemplateError as exc:
                raise TokenizerLoadError(f"{origin}: chat template does not compile: {exc}") from None
        return cls(tokenizer, template, str(file))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The prompt text of chat ``messages``, with the generation prompt; ``ValueError`` if the model has
        no chat template or the template rejects the messages."""
        if self.template is None:
            raise ValueError(f"{self.source}: the model has no chat template")
        try:
            return self.template.render([_plain_message(m) for m in messages])
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template: {exc}") from None

    def chat_token_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return self.encode(self.render_chat(messages), add_special_tokens=False)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"{path}: cannot read: {exc}") from None
    if not isinstance(config, dict):
        raise TokenizerLoadError(f"{path}: not a JSON object")
    return config


def _template_source(
    directory: Path, config: Mapping[str, Any], explicit: str | Path | None
) -> tuple[str, str] | None:
    """(template text, where it came from), or None when the model has none."""
    candidates = [Path(explicit)] if explicit is not None else [directory / TEMPLATE_FILE]
    for file in candidates:
        if explicit is not None or file.is_file():
            try:
                return file.read_text(encoding="utf-8"), str(file)
            except OSError as exc:
                raise TokenizerLoadError(f"{file}: cannot read the chat template: {exc}") from None
    value = config.get("chat_template")
    origin = f"{directory / CONFIG_FILE} chat_template"
    if isinstance(value, str):
        return value, origin
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        default = named.get("default")
        if isinstance(default, str):
            return default, origin
    return None


def _plain_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as vLLM hands string-format templates: a content list of text parts joined with newlines."""
    plain = dict(message)
    content = plain.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise ValueError('content parts must be objects {"type": "text", "text": "..."}')
        plain["content"] = "\n".join(texts)
    return plain
