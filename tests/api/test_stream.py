"""Reading relayed OpenAI responses: token counting, reply collection and usage, however chunks split."""

from __future__ import annotations

import json

import pytest

from slorouter.api.replies import CHAT, TEXT
from slorouter.api.stream import StreamObserver, observe_body, usage_from_tail


class Sink:
    def __init__(self, wanted: int) -> None:
        self.reply_chars_wanted = wanted
        self.tokens = 0
        self.replies: list[str] = []

    def on_tokens(self, count: int = 1) -> None:
        self.tokens += count

    def on_reply_text(self, text: str) -> None:
        self.replies.append(text)


def _chat_stream(pieces: list[str]) -> bytes:
    events = [
        "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}) + "\n\n"
        for piece in pieces
    ]
    usage = {"prompt_tokens": 5, "completion_tokens": len(pieces)}
    events.append("data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n")
    events.append("data: [DONE]\n\n")
    return "".join(events).encode()


def test_usage_is_read_from_the_stream_tail():
    tail = (
        b'data: {"choices":[{"text":"a"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert usage_from_tail(tail) == {"prompt_tokens": 3, "completion_tokens": 2}
    assert usage_from_tail(b'data: {"choices":[]}\n\n') is None
    assert usage_from_tail(b'garbage "usage" here') is None


@pytest.mark.parametrize("split_every", [1, 2, 7, 13, 64, 10_000])
def test_stream_observer_gets_the_same_answer_however_the_stream_is_split(split_every: int):
    pieces = ["Hel", "lo, ", "wörld", ' "quoted"\n', "!"]
    stream = _chat_stream(pieces)
    sink = Sink(wanted=1000)
    observer = StreamObserver(sink, CHAT)
    for start in range(0, len(stream), split_every):
        observer.feed(stream[start : start + split_every])
    usage = observer.finish()
    assert usage == {"prompt_tokens": 5, "completion_tokens": 5}
    assert "".join(sink.replies) == "".join(pieces)
    # One token per data: event but [DONE], even when its marker is split across chunks; the usage event
    # is counted too (the lifecycle takes usage's completion_tokens when it is larger).
    assert sink.tokens == len(pieces) + 1


def test_stream_observer_collects_nothing_when_no_plugin_wants_the_reply():
    sink = Sink(wanted=0)
    observer = StreamObserver(sink, CHAT)
    observer.feed(_chat_stream(["a", "b"]))
    observer.finish()
    assert sink.replies == [] and sink.tokens == 3


def test_stream_observer_collects_nothing_for_a_prompt_that_a_reply_cannot_continue():
    sink = Sink(wanted=100)
    observer = StreamObserver(sink, "")  # e.g. n > 1: several replies
    observer.feed(_chat_stream(["a"]))
    observer.finish()
    assert sink.replies == []


def test_observe_body_hands_over_choice_zero():
    body = json.dumps({"choices": [{"index": 0, "text": "the reply"}]}).encode()
    sink = Sink(wanted=100)
    observe_body(sink, body, TEXT)
    assert sink.replies == ["the reply"]
    quiet = Sink(wanted=0)
    observe_body(quiet, body, TEXT)
    assert quiet.replies == []
    broken = Sink(wanted=100)
    observe_body(broken, b"{not json", TEXT)
    assert broken.replies == []
