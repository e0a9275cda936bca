from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from slorouter.sim.text import PERIOD, TOKEN_TEXTS, output_bytes, output_text
from slorouter.tokenizer import (
    chat_to_prompt,
    count_tokens,
    decode,
    encode,
    encode_array,
    token_ids_to_bytes,
    utf8_length,
)

ENGLISH = (
    "Routing each request to the replica predicted to serve it fastest needs an estimate of how long its "
    "prompt is. Real tokenizers average about four characters per token on English prose like this."
)
SAMPLES = [
    "",
    "a",
    "abcd",
    "abcde",
    ENGLISH,
    "naïve café",
    "日本語のテキスト",
    "emoji 🙂🙃!",
    "\ud800 lone",
    "x" * 1001,
]


@pytest.mark.parametrize("text", SAMPLES)
def test_count_tokens_equals_len_encode(text):
    assert count_tokens(text) == len(encode(text)) == len(encode_array(text))


@pytest.mark.parametrize("text", [s for s in SAMPLES if "\ud800" not in s])
def test_decode_round_trips(text):
    assert decode(encode(text)) == text


def test_ids_are_the_little_endian_bytes():
    assert encode("abcd") == [0x64636261]
    assert encode("abcde") == [0x64636261, 0x65]


@pytest.mark.processes
def test_ids_are_stable_across_processes():
    code = "from slorouter.tokenizer import encode; print(encode('stable across processes?'))"
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert outputs == {f"{encode('stable across processes?')}\n"}


@pytest.mark.parametrize("cut", [0, 1, 4, 63, 64, 65, 150])
def test_shared_text_prefix_gives_shared_token_prefix(cut):
    a, b = ENGLISH[:cut] + " and then one thing", ENGLISH[:cut] + " or another"
    shared = cut // 4
    assert encode(a)[:shared] == encode(b)[:shared]
    assert encode(ENGLISH)[: len(ENGLISH[:cut]) // 4] == encode(ENGLISH[:cut])[:shared]


def test_about_four_characters_per_token_on_english():
    assert len(ENGLISH) / count_tokens(ENGLISH) == pytest.approx(4.0, rel=0.02)


def test_non_ascii_costs_more_tokens_per_character():
    text = "日本語のテキスト" * 10
    assert utf8_length(text) == 3 * len(text)
    assert count_tokens(text) > len(text) / 2


def test_token_ids_to_bytes_accepts_lists_and_arrays():
    ids = encode(ENGLISH)
    packed = token_ids_to_bytes(ids)
    assert (
        packed
        == token_ids_to_bytes(np.array(ids, dtype=np.int64))
        == token_ids_to_bytes(encode_array(ENGLISH))
    )
    with pytest.raises(ValueError):
        token_ids_to_bytes(np.array([-1]))
    with pytest.raises(OverflowError):
        token_ids_to_bytes([2**32])


def test_chat_template_accepts_strings_parts_and_null():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": None},
    ]
    prompt = chat_to_prompt(messages)
    assert "Be brief." in prompt and "Hello there" in prompt
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>   \n\n")
    assert not chat_to_prompt(messages, add_generation_prompt=False).endswith("\n\n")


def test_chat_template_puts_content_and_reply_on_token_boundaries():
    for content in ("@", "@@", "h@llé", "@@@@"):
        prompt = chat_to_prompt([{"role": "user", "content": content}])
        assert utf8_length(prompt) % 4 == 0
        start = prompt.index(content)
        assert utf8_length(prompt[:start]) % 4 == 0


def test_chat_history_is_a_prefix_of_the_next_turn():
    turn1 = [{"role": "user", "content": "What is a KV cache?"}]
    reply = output_text(0, 37)
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And paging?"}]
    first, second = chat_to_prompt(turn1), chat_to_prompt(turn2)
    assert second.startswith(first + reply)
    assert encode(second)[: count_tokens(first) + 37] == encode(first) + encode(reply)


@pytest.mark.parametrize(
    "messages",
    [
        ["not a dict"],
        [{"content": "no role"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    ],
)
def test_chat_template_rejects_malformed_messages(messages):
    with pytest.raises(ValueError):
        chat_to_prompt(messages)


def test_synthetic_output_is_made_of_4_byte_tokens():
    assert all(len(token) == 4 for token in TOKEN_TEXTS)
    text = output_text(0, 3 * PERIOD + 5)
    assert len(text) == 4 * (3 * PERIOD + 5)
    assert encode(text) == encode_array(text).tolist()
    assert (
        output_bytes(PERIOD - 2, PERIOD + 2)
        == (TOKEN_TEXTS[-2] + TOKEN_TEXTS[-1] + TOKEN_TEXTS[0] + TOKEN_TEXTS[1]).encode()
    )
    assert output_text(5, 5) == ""
