"""The reply text the gateway collects for the prefix index, and the history text it builds from it."""

from __future__ import annotations

import json

import pytest

from slorouter.api.replies import CHAT, TEXT, ReplyCollector, history_text, reply_from_body
from slorouter.api.requests import parse_chat_completion, parse_completion


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chat_delta(text: str) -> dict:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}


def text_delta(text: str) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text}]}


@pytest.mark.parametrize("split", [1, 7, 64, 10_000])
def test_collector_reads_chat_deltas_split_anywhere(split):
    stream = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        chat_delta("Hel"),
        chat_delta("lo, wörld"),
        chat_delta(' "quoted"\n'),
        {"choices": [{"index": 0, "delta": {"content": None}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"completion_tokens": 3}},
    )
    collector = ReplyCollector(CHAT, 1000)
    for start in range(0, len(stream), split):
        collector.feed(stream[start : start + split])
    assert collector.text == 'Hello, wörld "quoted"\n'


def test_collector_reads_completion_text_and_skips_what_is_not_json():
    collector = ReplyCollector(TEXT, 1000)
    collector.feed(
        b': keep-alive\n\ndata: {not json}\n\ndata: {"text": "\\x"}\n\n'
        + sse(text_delta("a"), text_delta("b"))
    )
    assert collector.text == "ab"


def test_collector_stops_once_it_has_the_budget():
    collector = ReplyCollector(TEXT, 5)
    collector.feed(sse(text_delta("abc"), text_delta("def")))
    assert collector.full and collector.text == "abcdef"
    collector.feed(sse(text_delta("more")))
    assert collector.text == "abcdef"


def test_reply_from_whole_bodies():
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"}}]}
    assert reply_from_body(json.dumps(chat).encode(), CHAT) == "Hi!"
    assert reply_from_body(json.dumps({"choices": [{"text": "ok"}]}).encode(), TEXT) == "ok"
    assert reply_from_body(b"not json", TEXT) is None
    assert reply_from_body(b"[1, 2]", CHAT) is None
    assert reply_from_body(json.dumps({"choices": [{"message": None}]}).encode(), CHAT) is None


def test_history_text_continues_the_prompt_as_the_next_turn_would_send_it():
    assert history_text("Once upon a time", ", a fox.", TEXT) == "Once upon a time, a fox."
    messages = [{"role": "user", "content": 'Say "hi" in Ελληνικά'}]
    prompt = json.dumps(messages, separators=(",", ":"), ensure_ascii=False)
    reply = 'Γεια σου, "friend"\n'
    follow_up = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "again"}]
    history = history_text(prompt, reply, CHAT)
    assert json.dumps(follow_up, separators=(",", ":"), ensure_ascii=False).startswith(history)
    assert history_text("not a JSON array", reply, CHAT) == ""


@pytest.mark.parametrize(
    ("path", "body", "form"),
    [
        ("chat", {"messages": [{"role": "user", "content": "hi"}]}, CHAT),
        ("chat", {"messages": [{"role": "user", "content": "hi"}], "n": 1}, CHAT),
        ("chat", {"messages": [{"role": "user", "content": "hi"}], "n": 2}, ""),
        ("completions", {"prompt": "hi"}, TEXT),
        ("completions", {"prompt": "hi", "n": 3}, ""),
        ("completions", {"prompt": ["a", "b"]}, ""),
        ("completions", {"prompt": [1, 2, 3]}, ""),
    ],
)
def test_which_requests_get_a_history(path, body, form):
    parse = parse_chat_completion if path == "chat" else parse_completion
    assert parse(json.dumps({"model": "m", **body}).encode()).history_form == form
