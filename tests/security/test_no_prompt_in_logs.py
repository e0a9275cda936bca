"""No prompt or completion text reaches the logs, at DEBUG, whatever the request: valid, malformed, refused,
or answered by a model server that echoes the prompt in an error, a non-JSON answer or a broken stream."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp import web

from tests.gateway.conftest import FakeUpstream, start_router

MARKER = "PROMPT-MARKER-7f3a9c"


def _marked_texts(caplog: pytest.LogCaptureFixture) -> list[str]:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return [text for record in caplog.records if MARKER in (text := formatter.format(record))]


BODIES: list[tuple[str, bytes]] = [
    ("/v1/completions", json.dumps({"model": "M", "prompt": MARKER, "max_tokens": 3}).encode()),
    (
        "/v1/completions",
        json.dumps({"model": "M", "prompt": MARKER, "max_tokens": 3, "stream": True}).encode(),
    ),
    (
        "/v1/chat/completions",
        json.dumps(
            {"model": "M", "messages": [{"role": "user", "content": MARKER}], "max_tokens": 3}
        ).encode(),
    ),
    ("/v1/completions", b'{"model": "M", "prompt": "' + MARKER.encode() + b'"'),  # cut JSON
    ("/v1/completions", b'{"model": "M", "prompt": "' + MARKER.encode() + b'\xff"}'),  # not UTF-8
    ("/v1/completions", json.dumps({"model": "M", "prompt": "x", "max_tokens": MARKER}).encode()),
    ("/v1/completions", json.dumps({"model": "M", "prompt": [MARKER, {"a": 1}]}).encode()),
    ("/v1/completions", json.dumps({"model": [MARKER], "prompt": "x"}).encode()),
    ("/v1/completions", json.dumps({"model": "M", "prompt": "x", "stream": MARKER}).encode()),
    (
        "/v1/chat/completions",
        json.dumps({"model": "M", "messages": [{"role": MARKER, "content": "x"}]}).encode(),
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": "M", "messages": [{"role": "user", "content": [MARKER]}]}).encode(),
    ),
    ("/v1/completions", json.dumps({"model": "M", "prompt": MARKER * 2000}).encode()),  # over the body limit
]


async def _drive(http, address: str, model: str, headers: dict[str, str] | None = None) -> list[int]:
    statuses = []
    for path, body in BODIES:
        body = body.replace(b'"M"', json.dumps(model).encode())
        json_body = {"Content-Type": "application/json", **(headers or {})}
        async with http.post(f"http://{address}{path}", data=body, headers=json_body) as resp:
            await resp.read()
            statuses.append(resp.status)
    bad_header = {"x-slo-ttft-ms": MARKER, "x-gateway-inference-objective": MARKER}
    async with http.post(
        f"http://{address}/v1/completions", json={"model": model, "prompt": MARKER}, headers=bad_header
    ) as resp:
        await resp.read()
        statuses.append(resp.status)
    return statuses


async def test_requests_to_real_model_servers_log_no_prompt(cluster, http, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    router = await start_router(list(cluster.addresses), gateway={"max_body_bytes": 16 * 1024})
    try:
        statuses = await _drive(http, router.address, cluster.model)
    finally:
        await router.stop()
    assert statuses[:3] == [200, 200, 200] and 400 in statuses and 413 in statuses
    assert caplog.records, "nothing was logged at DEBUG: the test would prove nothing"
    assert _marked_texts(caplog) == []


async def _echoing(request: web.Request) -> web.StreamResponse:
    """A model server that puts the prompt into every failure it can produce."""
    body = await request.read()
    mode = request.headers.get("x-mode", "")
    if mode == "not-json":
        return web.Response(status=200, body=b"<html>" + body + b"</html>")
    if mode == "bad-sse":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"garbage " + body + b"\n\n")
        return response
    if mode == "cut":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "' + MARKER.encode() + b'"}]}\n\n')
        assert request.transport is not None
        request.transport.abort()
        return response
    return web.Response(status=500, body=b'{"error": {"message": "bad prompt: ' + body + b'"}}')


async def test_model_server_errors_echoing_the_prompt_log_no_prompt(http, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    upstream = await FakeUpstream(_echoing).start()
    router = await start_router([upstream.address])
    try:
        seen = set()
        for mode in ("", "not-json", "bad-sse", "cut"):
            body = {"model": "fake", "prompt": MARKER, "max_tokens": 3, "stream": mode in ("bad-sse", "cut")}
            async with http.post(
                f"http://{router.address}/v1/completions", json=body, headers={"x-mode": mode}
            ) as resp:
                await resp.read()
                seen.add(resp.status)
        await _drive(http, router.address, "fake")
    finally:
        await router.stop()
        await upstream.close()
    assert {500, 502} <= seen
    assert any(r.levelno >= logging.WARNING for r in caplog.records), "no failure was logged"
    assert _marked_texts(caplog) == []
