"""``slorouter serve`` in front of three real llama-servers (static ``pool.endpoints``): the OpenAI API
streamed and not, with ``usage`` and ``stream_options.include_usage``; the ``llamacpp`` metrics dialect and
the KV signal it lacks; the router's prompt-token estimate against the engine's own count; the engine's own
error bodies; a client that leaves mid-stream."""

from __future__ import annotations

import http.client as httpclient
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realengine.conftest import (
    CTX_SIZE,
    MODEL,
    SLOTS,
    LlamaServer,
    chat,
    completion,
    idle,
    post,
    real_gateway,
    requires_engine,
    router_inflight,
)
from tests.reliability.conftest import GatewayProcess, wait_until

pytestmark = [requires_engine, pytest.mark.timeout(180), pytest.mark.processes]

PER_SLOT_CTX = CTX_SIZE // SLOTS  # llama-server gives each slot an equal share of --ctx-size


@pytest.fixture(scope="module")
def gateway(engines: list[LlamaServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("gateway")
    # llama-server exports no KV gauge: the in-flight estimate divides by this (one server's context).
    process = real_gateway(directory, engines, pool={"fallback_kv_capacity_tokens": CTX_SIZE})
    process.start("--record", str(directory / "traffic.jsonl"))
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def router(gateway: GatewayProcess, engines_up: list[LlamaServer]) -> GatewayProcess:
    wait_until(lambda: all(gateway.healthy(s.address) for s in engines_up), 15, "every endpoint healthy")
    return gateway


def recorded(gateway: GatewayProcess) -> list[dict[str, Any]]:
    """The requests of the gateway's ``--record`` file so far (written every 0.2 s)."""
    path = Path(gateway.config).parent / "traffic.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if '"arrival"' in line]


def records_after(gateway: GatewayProcess, seen: int, count: int = 1) -> list[dict[str, Any]]:
    """The ``count`` requests recorded after the first ``seen``, once they are written."""
    wait_until(lambda: len(recorded(gateway)) >= seen + count, 10, f"{count} more requests recorded")
    return recorded(gateway)[seen : seen + count]


def settled(gateway: GatewayProcess, engines: list[LlamaServer]) -> None:
    """Nothing in flight in the router, no slot busy in any engine."""
    wait_until(lambda: router_inflight(gateway) == 0, 15, "the router's in-flight count back to 0")
    wait_until(lambda: idle(engines), 15, "every llama-server slot free")


@pytest.mark.parametrize(
    ("path", "stream", "include_usage"),
    [
        ("/v1/completions", False, False),
        ("/v1/completions", True, False),
        ("/v1/completions", True, True),
        ("/v1/chat/completions", False, False),
        ("/v1/chat/completions", True, False),
        ("/v1/chat/completions", True, True),
    ],
)
def test_completions_and_chat_streamed_and_not(
    router: GatewayProcess, engines_up: list[LlamaServer], path: str, stream: bool, include_usage: bool
):
    """The engine's answer reaches the client whole, with the router's headers; ``usage`` is where the
    request asked for it, and the router's record of the request takes its token count from it."""
    body = completion(max_tokens=5) if path == "/v1/completions" else chat(max_tokens=5)
    if stream:
        body["stream"] = True
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    seen = len(recorded(router))
    reply = post(router.address, path, body)
    assert reply.ok, (reply.status, reply.body, reply.events[-3:])
    assert reply.endpoint in {s.address for s in engines_up}
    assert reply.headers["x-slorouter-route"] == "heuristic"
    kind = "text_completion" if path == "/v1/completions" else "chat.completion"
    if not stream:
        answer = reply.json()
        assert answer["object"] == kind and answer["model"] == MODEL
        usage = answer["usage"]
        text = answer["choices"][0].get("text") or answer["choices"][0]["message"]["content"]
        assert isinstance(text, str)
    else:
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert reply.events[-1] == b"[DONE]"
        chunks = reply.chunks
        assert {c["object"] for c in chunks} == {kind + ("" if kind == "text_completion" else ".chunk")}
        with_usage = [c["usage"] for c in chunks if c.get("usage")]
        # llama-server's /v1/completions stream carries usage in its last event whether asked or not; its
        # chat stream only when asked, in an event of its own (no choices), as OpenAI's does.
        if include_usage or path == "/v1/completions":
            assert len(with_usage) == 1 and chunks[-1].get("usage") == with_usage[0]
            usage = with_usage[0]
        else:
            assert with_usage == []
            usage = None
        if include_usage and path == "/v1/chat/completions":
            assert chunks[-1]["choices"] == []
    if usage is not None:
        assert 1 <= usage["completion_tokens"] <= 5
        assert usage["prompt_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    (record,) = records_after(router, seen)
    assert record["status"] == 200 and record["endpoint"] == reply.endpoint and record["stream"] is stream
    if usage is not None:
        assert record["output_tokens"] == usage["completion_tokens"]
    settled(router, engines_up)


def test_llamacpp_dialect_is_detected_and_the_missing_kv_signal_estimated(
    router: GatewayProcess, engines_up: list[LlamaServer]
):
    """Every endpoint's page is read as ``llamacpp``; it has no KV gauge, which the router reports and
    replaces by its in-flight estimate; the running count it routes on is llama-server's own
    ``llamacpp:requests_processing``."""
    dialects = router.metric("slorouter_endpoint_metrics_dialect")
    for server in engines_up:
        assert dialects.get(f'{{dialect="llamacpp",endpoint="{server.address}"}}') == 1.0, dialects
    missing = router.metric("slorouter_endpoint_metric_missing")
    for server in engines_up:
        key = f'{{endpoint="{server.address}",metric="llamacpp:kv_cache_usage_ratio",signal="kv_usage"}}'
        assert missing.get(key) == 1.0, missing
    assert not any('signal="running"' in key or 'signal="waiting"' in key for key in missing), missing

    # One long stream: while it runs, its endpoint's running count (scraped) and KV estimate are above 0.
    seen: dict[str, float] = {}
    result: list[Any] = []

    def long_stream() -> None:
        body = completion("Once upon a time", max_tokens=400, stream=True)
        result.append(post(router.address, "/v1/completions", body, leave_after=60, timeout=60))

    thread = threading.Thread(target=long_stream)
    thread.start()
    try:

        def observed() -> bool:
            running = router.metric("slorouter_endpoint_running_requests")
            kv = router.metric("slorouter_endpoint_kv_cache_usage")
            busy = [k for k, v in running.items() if v == 1.0]
            if busy:
                seen["running"] = 1.0
                seen["kv"] = kv[busy[0]]
            return bool(busy) and seen["kv"] > 0

        wait_until(observed, 30, "a running request scraped from llamacpp:requests_processing")
    finally:
        thread.join(timeout=90)
    assert result and result[0].status == 200
    # (in-flight prompt + decode tokens) / fallback_kv_capacity_tokens: at most 404 of 2048
    assert 0 < seen["kv"] <= (4 + 400) / CTX_SIZE
    settled(router, engines_up)


def test_the_routers_tpot_divides_by_the_engines_token_count(
    router: GatewayProcess, engines_up: list[LlamaServer]
):
    """The time per output token the router observes for a stream (its TPOT histogram, its predictor's
    training samples, its record) is the stream's span over the engine's own ``usage.completion_tokens``
    less one, not over the events it counted: llama-server's chat stream has three events without a token
    (the role, the closing finish_reason, the usage), its completions stream one. So it agrees with
    llama-server's own ``timings.predicted_per_token_ms`` (the median of three, within 20 %); divided by
    the events, a 6-token chat stream would have been 5/8 of it."""
    for make in (chat, completion):
        ratios = []
        for i in range(3):
            body = make(f"Count from one to ten, take {i}.", max_tokens=6, stream=True, ignore_eos=True)
            body["stream_options"] = {"include_usage": True}
            seen = len(recorded(router))
            reply = post(router.address, "/v1/chat/completions" if make is chat else "/v1/completions", body)
            assert reply.ok
            assert len(reply.events) > 7  # [DONE] and events without a token besides the 6 tokens
            engine = next(c["timings"] for c in reversed(reply.chunks) if "timings" in c)
            (record,) = records_after(router, seen)
            assert record["output_tokens"] == 6 and engine["predicted_n"] == 6
            ratios.append(record["tpot_ms"] / engine["predicted_per_token_ms"])
        assert 0.8 <= sorted(ratios)[1] <= 1.25, (make.__name__, ratios)
    settled(router, engines_up)


# The router estimates a prompt's tokens as its UTF-8 bytes / 4 (slorouter.tokenizer); Gemma 3's tokenizer
# (SentencePiece, 262k pieces) is the truth here. The error allowed, engine's count (BOS included) = 1:
PROSE_BOUNDS = (0.75, 1.4)  # English, German and Chinese prose, and chat (its template differs)
DIGITS_AND_CODE_BOUNDS = (0.2, 0.8)  # under-estimated: one token per digit, indentation in pieces
PROMPTS = {
    "english": (
        "The history of Paris spans more than two thousand years, from a small Gallic settlement on an "
        "island in the Seine to one of the great capitals of Europe, a centre of learning, art and politics.",
        PROSE_BOUNDS,
    ),
    "german": (
        "Die Geschichte von Paris umfasst mehr als zweitausend Jahre, von einer kleinen gallischen Siedlung "
        "bis zu einer der großen Hauptstädte Europas.",
        PROSE_BOUNDS,
    ),
    "chinese": (
        "巴黎的历史跨越两千多年，从塞纳河上一个岛屿上的小型高卢定居点，发展成为欧洲最伟大的首都之一。",
        PROSE_BOUNDS,
    ),
    "digits": (
        "3.14159 2.71828 1.41421 1.73205 2.23606 0.57721 1.61803 4.66920 2.50290",
        DIGITS_AND_CODE_BOUNDS,
    ),
    "code": (
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        DIGITS_AND_CODE_BOUNDS,
    ),
}


def test_the_routers_prompt_token_estimate_against_the_engines_count(
    router: GatewayProcess, engines_up: list[LlamaServer]
):
    """The router's estimate (its ``--record`` file's ``prompt_tokens``) over the engine's
    ``usage.prompt_tokens`` stays within the bounds stated above; the engine's count is its tokenizer's
    (``/tokenize`` with the BOS token gives the same number)."""
    ratios: dict[str, float] = {}
    for name, (text, bounds) in PROMPTS.items():
        seen = len(recorded(router))
        reply = post(router.address, "/v1/completions", completion(text, max_tokens=1))
        assert reply.ok, reply.body
        engine = reply.json()["usage"]["prompt_tokens"]
        assert engine == len(engines_up[0].tokenize(text))
        (record,) = records_after(router, seen)
        ratios[name] = record["prompt_tokens"] / engine
        assert bounds[0] <= ratios[name] <= bounds[1], (name, record["prompt_tokens"], engine)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": PROMPTS["english"][0]},
    ]
    seen = len(recorded(router))
    reply = post(
        router.address, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1}
    )
    assert reply.ok, reply.body
    (record,) = records_after(router, seen)
    ratios["chat"] = record["prompt_tokens"] / reply.json()["usage"]["prompt_tokens"]
    assert PROSE_BOUNDS[0] <= ratios["chat"] <= PROSE_BOUNDS[1], ratios


@pytest.mark.parametrize("stream", [False, True])
def test_the_engines_errors_reach_the_client(
    router: GatewayProcess, engines_up: list[LlamaServer], stream: bool
):
    """llama-server's own 400s (a prompt longer than a slot's context; a parameter of the wrong type) come
    through unchanged, as JSON even for a stream (llama-server answers a stream's first error that way); the
    endpoint stays healthy, nothing stays in flight. A body the router itself can tell is wrong gets the
    router's 400 without reaching an engine."""
    before = sum(server.metric("llamacpp:prompt_tokens_total") for server in engines_up)
    seen = len(recorded(router))
    too_long = completion("hello world " * PER_SLOT_CTX, max_tokens=4, stream=stream)  # 2 tokens a repeat
    reply = post(router.address, "/v1/completions", too_long)
    assert reply.status == 400 and reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == PER_SLOT_CTX
    assert "exceeds the available context size" in error["message"]
    assert reply.endpoint in {s.address for s in engines_up}

    wrong_type = chat(stream=stream, temperature="hot")
    reply = post(router.address, "/v1/chat/completions", wrong_type)
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and "temperature" in error["message"]

    reply = post(router.address, "/v1/completions", completion(max_tokens="four", stream=stream))
    assert reply.status == 400 and "x-slorouter-endpoint" not in reply.headers
    assert reply.json()["error"]["param"] == "max_tokens"

    assert [r["status"] for r in records_after(router, seen, 2)] == [400, 400]
    assert all(router.healthy(s.address) for s in engines_up)
    settled(router, engines_up)
    # Neither rejected prompt was evaluated.
    assert sum(server.metric("llamacpp:prompt_tokens_total") for server in engines_up) == before


def test_a_client_that_leaves_mid_stream_frees_the_engines_slot_and_the_routers_count(
    router: GatewayProcess, engines_up: list[LlamaServer]
):
    """A client that closes its connection after three events of a 400-token stream: the router closes its
    upstream connection, llama-server stops the generation and frees the slot
    (``llamacpp:requests_processing`` back to 0, far fewer than 400 tokens generated), and the router's
    in-flight count goes back to 0, the request counted as a client disconnect."""
    disconnects = router.total("slorouter_client_disconnects_total")
    before = sum(server.metric("llamacpp:tokens_predicted_total") for server in engines_up)
    reply = post(
        router.address, "/v1/completions", completion("Once upon a time", 400, stream=True), leave_after=3
    )
    assert reply.status == 200 and len(reply.events) == 3
    wait_until(lambda: router.total("slorouter_client_disconnects_total") == disconnects + 1, 15,
               "the disconnect counted")  # fmt: skip
    settled(router, engines_up)
    generated = sum(s.metric("llamacpp:tokens_predicted_total") for s in engines_up) - before
    assert generated < 400, "the engine generated the whole answer for a client that had left"


def test_a_client_that_leaves_before_a_whole_answer_frees_the_routers_count(
    router: GatewayProcess, engines_up: list[LlamaServer]
):
    """A client that leaves while it waits for a non-streamed answer: the router counts the disconnect and
    releases the request at once, and closes its upstream connection. llama-server, though, looks at a
    waiting non-streamed request's connection only after a second without any result in its queue (its
    ``server_response::recv_with_timeout`` restarts the wait at every result, its /metrics answers
    included), so under the router's 50 ms scrapes it generates the answer to the end: the slot is free
    when the generation is."""
    disconnects = router.total("slorouter_client_disconnects_total")
    body = completion("Once upon a time", max_tokens=64)
    conn = httpclient.HTTPConnection(router.address, timeout=60)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        wait_until(lambda: not idle(engines_up), 30, "an engine generating")
    finally:
        conn.close()
    wait_until(lambda: router.total("slorouter_client_disconnects_total") == disconnects + 1, 15,
               "the disconnect counted")  # fmt: skip
    wait_until(lambda: router_inflight(router) == 0, 15, "the router's in-flight count back to 0")
    wait_until(lambda: idle(engines_up), 60, "the engine's slot free once the generation ends")
