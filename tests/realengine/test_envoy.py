"""A real Envoy with ext_proc in front of ``slorouter epp --envoy`` and three llama-servers (the picker's
``original_dst`` cluster: Envoy connects to the endpoint the picker names): the OpenAI API streamed and not,
the engine's error bodies, a client that leaves mid-stream, the ``llamacpp`` dialect on the picker's side."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.epp import Picker, requires_envoy, start_epp
from tests.helpers.processes import free_port, stop_all
from tests.realengine.conftest import (
    SLOTS,
    LlamaServer,
    chat,
    completion,
    idle,
    post,
    requires_engine,
)
from tests.reliability.conftest import http, samples, wait_until

pytestmark = [requires_engine, requires_envoy, pytest.mark.timeout(180), pytest.mark.processes]


class Front:
    """Envoy's listener and the picker's metrics page."""

    def __init__(self, picker: Picker, address: str) -> None:
        self.picker = picker
        self.address = address

    def metric(self, name: str) -> dict[str, float]:
        code, _, body = http("GET", self.picker.metrics_url)
        assert code == 200, body
        return samples(body.decode(), name)

    def inflight(self) -> float:
        return sum(self.metric("slorouter_inflight_requests").values())


@pytest.fixture(scope="module")
def front(engines: list[LlamaServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    port = free_port()
    config = {
        "gateway": {"host": "127.0.0.1", "port": port},  # Envoy's listener
        "pool": {"endpoints": [s.address for s in engines], "scrape_interval_ms": 50},
        "seed": 7,
    }
    picker = start_epp(config, tmp_path_factory.mktemp("envoy"), "--envoy", "--envoy-cluster", "original_dst")
    try:
        yield Front(picker, f"127.0.0.1:{port}")
    finally:
        stop_all([picker.process])


def settled(front: Front, engines: list[LlamaServer]) -> None:
    wait_until(lambda: front.inflight() == 0, 15, "the picker's in-flight count back to 0")
    wait_until(lambda: idle(engines), 30, "every llama-server slot free")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_completions_and_chat_through_envoy(
    front: Front, engines_up: list[LlamaServer], path: str, stream: bool
):
    options = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    body = completion(max_tokens=4, **options) if path == "/v1/completions" else chat(max_tokens=4, **options)
    reply = post(front.address, path, body)
    assert reply.ok, (reply.status, reply.body, reply.events[-2:])
    assert reply.endpoint in {s.address for s in engines_up}
    assert reply.headers["server"] == "envoy"
    usage = reply.chunks[-1]["usage"] if stream else reply.json()["usage"]
    assert 1 <= usage["completion_tokens"] <= 4 and usage["prompt_tokens"] > 0
    settled(front, engines_up)


def test_the_picker_reads_the_llamacpp_dialect(front: Front, engines_up: list[LlamaServer]):
    dialects = front.metric("slorouter_endpoint_metrics_dialect")
    for server in engines_up:
        assert dialects.get(f'{{dialect="llamacpp",endpoint="{server.address}"}}') == 1.0, dialects
    missing = front.metric("slorouter_endpoint_metric_missing")
    assert sorted(k for k, v in missing.items() if v == 1.0) == sorted(
        f'{{endpoint="{s.address}",metric="llamacpp:kv_cache_usage_ratio",signal="kv_usage"}}'
        for s in engines_up
    )


@pytest.mark.parametrize("stream", [False, True])
def test_the_engines_errors_reach_the_client_through_envoy(
    front: Front, engines_up: list[LlamaServer], stream: bool
):
    too_long = completion("hello world " * (2048 // SLOTS), max_tokens=4, stream=stream)
    reply = post(front.address, "/v1/completions", too_long)
    assert reply.status == 400 and reply.headers["content-type"].startswith("application/json")
    assert reply.json()["error"]["type"] == "exceed_context_size_error"
    reply = post(front.address, "/v1/chat/completions", chat(stream=stream, top_k="many"))
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and "top_k" in error["message"]
    settled(front, engines_up)


def test_a_client_that_leaves_mid_stream_through_envoy(front: Front, engines_up: list[LlamaServer]):
    """Envoy resets the upstream stream when the client goes: llama-server frees the slot before the 400
    tokens are generated, and the picker completes the request as a client disconnect."""
    disconnects = sum(front.metric("slorouter_client_disconnects_total").values())
    before = sum(server.metric("llamacpp:tokens_predicted_total") for server in engines_up)
    body = completion("Once upon a time", max_tokens=400, stream=True)
    reply = post(front.address, "/v1/completions", body, leave_after=3)
    assert reply.status == 200 and len(reply.events) == 3
    wait_until(
        lambda: sum(front.metric("slorouter_client_disconnects_total").values()) == disconnects + 1,
        15,
        "the disconnect counted",
    )
    settled(front, engines_up)
    generated = sum(server.metric("llamacpp:tokens_predicted_total") for server in engines_up) - before
    assert generated < 400
