"""slorouter.hftokenizer: a model's tokenizer.json and chat template, loaded and applied as vLLM pods do
(the template rendered in transformers' Jinja environment, with the generation prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slorouter.hftokenizer.chat_template import ChatTemplate, special_tokens
from slorouter.hftokenizer.model import ModelTokenizer, TokenizerLoadError

from . import tiny

CHAT = [{"role": "system", "content": "you are helpful"}, {"role": "user", "content": "what is w1 ?"}]


def test_a_directory_or_its_tokenizer_json_loads(tmp_path: Path) -> None:
    directory = tiny.build(tmp_path / "m")
    for path in (directory, directory / "tokenizer.json", str(directory)):
        tokenizer = ModelTokenizer.load(path)
        vocab = tiny.vocabulary()
        assert tokenizer.encode("what is w1") == [vocab["<s>"], vocab["what"], vocab["is"], vocab["w1"]]
        assert tokenizer.encode("what is w1", add_special_tokens=False) == [
            vocab[w] for w in ("what", "is", "w1")
        ]


def test_chatml_renders_as_transformers_renders_it(tmp_path: Path) -> None:
    tokenizer = ModelTokenizer.load(tiny.build(tmp_path / "m"))
    assert tokenizer.render_chat(CHAT) == (
        "<|im_start|>system\nyou are helpful<|im_end|>\n"
        "<|im_start|>user\nwhat is w1 ?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    vocab = tiny.vocabulary()
    ids = tokenizer.chat_token_ids(CHAT)
    assert ids[:3] == [vocab["<|im_start|>"], vocab["system"], vocab["you"]]  # no BOS: the template's own
    assert ids[-2:] == [vocab["<|im_start|>"], vocab["assistant"]]


def test_llama3_renders_with_bos_from_the_config_trimmed_content_and_text_parts_joined(
    tmp_path: Path,
) -> None:
    tokenizer = ModelTokenizer.load(tiny.build(tmp_path / "m", tiny.LLAMA3, bos="<|begin_of_text|>"))
    parts = [{"type": "text", "text": " what"}, {"type": "text", "text": "is "}]
    rendered = tokenizer.render_chat(
        [{"role": "system", "content": "  you  "}, {"role": "user", "content": parts}]
    )
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nyou<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nwhat\nis<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    with pytest.raises(ValueError, match="chat template: unknown role tool"):
        tokenizer.render_chat([{"role": "tool", "content": "x"}])


def test_non_text_content_parts_are_refused(tmp_path: Path) -> None:
    tokenizer = ModelTokenizer.load(tiny.build(tmp_path / "m"))
    with pytest.raises(ValueError, match="content parts"):
        tokenizer.render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


def test_the_template_comes_from_a_file_then_chat_template_jinja_then_the_config(tmp_path: Path) -> None:
    directory = tiny.build(tmp_path / "m")
    (directory / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert ModelTokenizer.load(directory).render_chat(CHAT) == "J2"
    explicit = tmp_path / "override.jinja"
    explicit.write_text("E{{ add_generation_prompt }}")
    assert ModelTokenizer.load(directory, explicit).render_chat(CHAT) == "ETrue"
    named = tiny.build(tmp_path / "n", chat_template=None)
    config = json.loads((named / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (named / "tokenizer_config.json").write_text(json.dumps(config))
    assert ModelTokenizer.load(named).render_chat(CHAT) == "D"


def test_a_model_without_a_template_tokenizes_completions_only(tmp_path: Path) -> None:
    tokenizer = ModelTokenizer.load(tiny.build(tmp_path / "m", chat_template=None))
    assert tokenizer.encode("w1") == [1, tiny.vocabulary()["w1"]]
    with pytest.raises(ValueError, match="has no chat template"):
        tokenizer.chat_token_ids(CHAT)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="nothing: no such file or directory"):
        ModelTokenizer.load(tmp_path / "nothing")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(TokenizerLoadError, match=r"nothing/tokenizer\.json: no such tokenizer file"):
        ModelTokenizer.load(tmp_path / "nothing")
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(TokenizerLoadError, match=r"bad\.json: not a tokenizer\.json"):
        ModelTokenizer.load(bad)
    directory = tiny.build(tmp_path / "m", chat_template="{% for %}")
    with pytest.raises(
        TokenizerLoadError, match=r"tokenizer_config\.json chat_template: chat template does not"
    ):
        ModelTokenizer.load(directory)
    (directory / "tokenizer_config.json").write_text("{")
    with pytest.raises(TokenizerLoadError, match=r"tokenizer_config\.json: cannot read"):
        ModelTokenizer.load(directory)
    (directory / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerLoadError, match=r"missing\.jinja: cannot read the chat template"):
        ModelTokenizer.load(directory / "tokenizer.json", tmp_path / "missing.jinja")


def test_the_environment_is_transformers() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}"
        "|{{ {'b': 'é', 'a': 1} | tojson(indent=1, sort_keys=True) }}"
        "|{{ tools is none and documents is none }}|{{ strftime_now('%Y') | length }}|{{ eos_token }}"
    )
    template = ChatTemplate(source, special_tokens({"eos_token": {"content": "</s>"}, "pad_token": None}))
    rendered = template.render([{"role": "user", "content": "é"}, {"role": "x", "content": ""}])
    assert rendered == '{"role": "user", "content": "é"}|{\n "a": 1,\n "b": "é"\n}|True|4|</s>'
    with pytest.raises(Exception, match="stop here"):
        ChatTemplate("{{ raise_exception('stop here') }}").render([])
    # trim_blocks and lstrip_blocks: a block tag's line leaves no whitespace behind.
    assert ChatTemplate("a\n  {% if true %}\nb\n  {% endif %}\nc").render([]) == "a\nb\nc"
