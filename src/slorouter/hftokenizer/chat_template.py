"""A model's chat template rendered as Hugging Face transformers' ``apply_chat_template`` renders it.

The template is Jinja2 compiled in transformers' environment: an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and the ``{% generation %}`` block
(rendered as its body), the ``tojson`` filter taking ``ensure_ascii``/``indent``/``separators``/
``sort_keys`` (non-ASCII kept, as transformers does), and the globals ``raise_exception`` and
``strftime_now``. It is rendered with ``messages``, ``tools`` and ``documents`` (both None),
``add_generation_prompt`` and the tokenizer's special tokens (``bos_token``, ``eos_token``, …) from
``tokenizer_config.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class _GenerationBlock(jinja2.ext.Extension):
    """transformers' ``{% generation %}…{% endgeneration %}`` (it marks assistant text): renders the body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's own class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens of a ``tokenizer_config.json`` (each a string or an ``AddedToken`` object)."""
    found: dict[str, str] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, Mapping):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    return found


class ChatTemplate:
    """One compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, tokens: Mapping[str, str] | None = None) -> None:
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        self.template = environment.from_string(source)  # raises jinja2.TemplateSyntaxError
        self.tokens = dict(tokens or {})

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.template.render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.tokens,
        )
