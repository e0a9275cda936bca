"""The gateway in front of real simulated pods on loopback: routing, streaming and failure handling."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from slorouter.gateway.runtime import Router
from slorouter.http.server import ServerLimits
from slorouter.scheduling.prefix_blocks import prefix_block_hashes, prefix_seed
from tests.gateway.conftest import FakeUpstream, eventually, start_router


async def _completion(
    http: aiohttp.ClientSession, router: Router, body: dict, **kw
) -> aiohttp.ClientResponse:
    return await http.post(f"http://{router.address}/v1/completions", json=body, **kw)


async def test_non_streaming_completion_is_proxied(cluster, router, http):
    body = {"model": cluster.model, "prompt": "Hello there, how are you today?", "max_tokens": 5}
    async with await _completion(http, router, body) as resp:
        assert resp.status == 200
        assert resp.headers["x-slorouter-endpoint"] in cluster.addresses
        assert resp.headers["x-slorouter-route"] == "heuristic"
        data = await resp.json()
    assert data["object"] == "text_completion"
    assert data["usage"]["completion_tokens"] == 5


async def test_streaming_chat_completion_relays_every_token(cluster, router, http):
    body = {
        "model": cluster.model,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = f"http://{router.address}/v1/chat/completions"
    async with http.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["x-slorouter-endpoint"] in cluster.addresses
        text = (await resp.read()).decode()
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    token_chunks = [c for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content")]
    assert len(token_chunks) == 6
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    # The gateway's own metrics saw the stream: TTFT and TPOT recorded, nothing left in flight.
    await eventually(lambda: int(router.pool.columns["inflight_requests"].sum()) == 0)
    async with http.get(f"http://{router.address}/metrics") as resp:
        metrics = await resp.text()
    assert "inference_objective_request_ttft_seconds_count{" in metrics
    assert f'model_name="{cluster.model}"' in metrics
    assert "inference_objective_request_tpot_seconds_count{" in metrics


async def test_routing_avoids_a_loaded_pod(cluster, router, http):
    busy = cluster.addresses[0]
    # Load one pod directly (bypassing the gateway) with long requests that fill part of its KV cache.
    long_prompt = "lorem ipsum dolor sit amet " * 1200
    direct = [
        asyncio.create_task(
            http.post(
                f"http://{busy}/v1/completions",
                json={"model": cluster.model, "prompt": f"{i} {long_prompt}", "max_tokens": 4000},
            )
        )
        for i in range(6)
    ]
    try:
        await eventually(lambda: router.pool.value(busy, "kv_usage") > 0.02)
        picked = []
        for i in range(8):
            body = {"model": cluster.model, "prompt": f"short question number {i}", "max_tokens": 2}
            async with await _completion(http, router, body) as resp:
                assert resp.status == 200
                picked.append(resp.headers["x-slorouter-endpoint"])
        assert busy not in picked
    finally:
        for task in direct:
            task.cancel()
        await asyncio.gather(*direct, return_exceptions=True)


async def test_requests_follow_prefix_affinity(cluster, router, http):
    history = "System: you are a helpful assistant who answers in detail. " * 40
    body = {"model": cluster.model, "prompt": history + "User: first question", "max_tokens": 2}
    async with await _completion(http, router, body) as resp:
        first = resp.headers["x-slorouter-endpoint"]
    for turn in range(5):
        body = {"model": cluster.model, "prompt": history + f"User: follow-up {turn}", "max_tokens": 2}
        async with await _completion(http, router, body) as resp:
            assert resp.status == 200
            assert resp.headers["x-slorouter-endpoint"] == first


async def test_client_disconnect_cancels_the_upstream_request(cluster, router, http):
    body = {"model": cluster.model, "prompt": "write forever", "max_tokens": 5000, "stream": True}
    resp = await _completion(http, router, body)
    assert resp.status == 200
    target = resp.headers["x-slorouter-endpoint"]
    await resp.content.readline()
    resp.close()  # drop the connection mid-stream

    async def upstream_idle() -> bool:
        async with http.get(f"http://{target}/metrics") as m:
            text = await m.text()
        running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
        return bool(running) and float(running[0].rsplit(" ", 1)[1]) == 0

    await eventually(upstream_idle)
    await eventually(lambda: int(router.pool.columns["inflight_requests"].sum()) == 0)
    await eventually(lambda: int(router.pool.columns["inflight_decode_tokens"].sum()) == 0)


async def test_endpoint_killed_mid_stream_ends_with_an_error_event(http):
    async def dies_mid_stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            chunk = {"choices": [{"index": 0, "text": f"t{i}"}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        request.transport.abort()  # the pod dies
        return response

    upstream = await FakeUpstream(dies_mid_stream).start()
    router = await start_router([upstream.address])
    try:
        body = {"model": "fake", "prompt": "hi", "max_tokens": 10, "stream": True}
        async with await _completion(http, router, body) as resp:
            assert resp.status == 200
            text = (await resp.read()).decode()
        assert text.count('"text"') == 3
        # An OpenAI-style error event, then [DONE]: a client's SDK ends the stream instead of waiting.
        error_event, done = text.rstrip("\n").split("\n\n")[-2:]
        assert json.loads(error_event.removeprefix("data: "))["error"]["code"] == 502
        assert done == "data: [DONE]"
        await eventually(lambda: int(router.pool.columns["inflight_requests"].sum()) == 0)
        metrics = router.metrics.render().decode()
        assert (
            'slorouter_upstream_failures_total{endpoint="' + upstream.address + '",phase="stream"} 1.0'
            in metrics
        )
    finally:
        await router.stop()
        await upstream.close()


async def test_upstream_failing_before_responding_is_retried_elsewhere(cluster, http):
    async def hangs_up(request: web.Request) -> web.StreamResponse:
        request.transport.abort()
        raise asyncio.CancelledError

    bad = await FakeUpstream(hangs_up).start()
    router = await start_router([bad.address, cluster.addresses[0]])
    try:
        for i in range(10):
            body = {"model": cluster.model, "prompt": f"question {i}", "max_tokens": 2}
            async with await _completion(http, router, body) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers["x-slorouter-endpoint"] == cluster.addresses[0]
        assert bad.calls >= 1
        metrics = router.metrics.render().decode()
        assert f"slorouter_upstream_retries_total {float(bad.calls)}" in metrics
    finally:
        await router.stop()
        await bad.close()


async def test_only_endpoint_failing_gives_502(http):
    async def hangs_up(request: web.Request) -> web.StreamResponse:
        request.transport.abort()
        raise asyncio.CancelledError

    bad = await FakeUpstream(hangs_up).start()
    router = await start_router([bad.address])
    try:
        async with await _completion(http, router, {"model": "fake", "prompt": "x", "max_tokens": 1}) as resp:
            assert resp.status == 502
            error = (await resp.json())["error"]
        assert "failed before responding" in error["message"]
        assert int(router.pool.columns["inflight_requests"].sum()) == 0
    finally:
        await router.stop()
        await bad.close()


async def test_no_healthy_endpoint_gives_503(http):
    # Nothing listens on this port: scrapes fail and the endpoint leaves the candidate set.
    probe = await FakeUpstream(lambda r: None).start()  # type: ignore[arg-type]
    dead = probe.address
    await probe.close()
    router = await start_router([dead], pool={"unhealthy_after_failures": 1})
    try:
        await eventually(lambda: not router.pool.is_healthy(dead))
        async with await _completion(http, router, {"model": "m", "prompt": "x"}) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"]
            assert (await resp.json())["error"]["type"] == "ServiceUnavailableError"
        async with http.get(f"http://{router.address}/ready") as resp:
            assert resp.status == 503
    finally:
        await router.stop()


async def test_body_is_forwarded_byte_for_byte_with_end_to_end_headers_only(http):
    seen: dict = {}

    async def records(request: web.Request) -> web.StreamResponse:
        seen["body"] = await request.read()
        seen["headers"] = request.headers.copy()
        return web.json_response({"ok": True}, headers={"X-Upstream": "yes"})

    upstream = await FakeUpstream(records).start()
    router = await start_router([upstream.address], gateway={"api_keys": ["k"]})
    try:
        raw = b'{ "model" : "fake",  "prompt": "h\\u00e9llo",\n "max_tokens": 3 }'
        headers = {
            "Authorization": "Bearer k",
            "X-Request-Id": "req-1",
            "X-Custom": "c",
            "Connection": "keep-alive",
            "Content-Type": "application/json",
        }
        async with http.post(f"http://{router.address}/v1/completions", data=raw, headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["X-Upstream"] == "yes"
            assert resp.headers["x-slorouter-endpoint"] == upstream.address
            assert await resp.json() == {"ok": True}
        assert seen["body"] == raw
        assert seen["headers"]["X-Request-Id"] == "req-1"
        assert seen["headers"]["X-Custom"] == "c"
        assert "Authorization" not in seen["headers"]  # the gateway's key stays at the gateway
        assert seen["headers"]["Content-Length"] == str(len(raw))
    finally:
        await router.stop()
        await upstream.close()


async def test_a_conversations_next_turn_matches_its_whole_history_on_the_pod_that_answered(
    cluster, router, http
):
    (producer,) = [
        p for p in router.director.setup.data_producers if p.type_name == "approx-prefix-cache-producer"
    ]
    messages = [
        {"role": "system", "content": "You are a helpful assistant who answers in detail. " * 10},
        {"role": "user", "content": "Tell me about the history of tea."},
    ]
    for stream in (True, False):
        body = {"model": cluster.model, "messages": messages, "max_tokens": 40, "stream": stream}
        async with http.post(f"http://{router.address}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            pod = resp.headers["x-slorouter-endpoint"]
            raw = await resp.read()
        if stream:
            events = [
                json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")
            ]
            reply = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        else:
            reply = json.loads(raw)["choices"][0]["message"]["content"]
        messages = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And then?"},
        ]
        compact = json.dumps(messages, separators=(",", ":"), ensure_ascii=False).encode()
        request_hashes = prefix_block_hashes(compact, prefix_seed(cluster.model), 64, 256)
        answered = json.dumps(messages[:-1], separators=(",", ":"), ensure_ascii=False).encode()[:-1]
        await eventually(lambda: int(router.pool.columns["inflight_requests"].sum()) == 0)
        # Every full block of the history up to the reply is on the pod that answered.
        assert producer.index.match(request_hashes) == {pod: len(answered) // 64}
        assert len(answered) // 64 < len(request_hashes)


async def test_headers_named_by_connection_are_hop_by_hop_in_both_directions(http):
    seen: dict = {}

    async def records(request: web.Request) -> web.StreamResponse:
        seen["headers"] = request.headers.copy()
        return web.json_response(
            {"ok": True}, headers={"Connection": "X-Upstream-Hop", "X-Upstream-Hop": "1", "X-Upstream": "yes"}
        )

    upstream = await FakeUpstream(records).start()
    router = await start_router([upstream.address])
    try:
        headers = {"Connection": "keep-alive, X-Hop", "X-Hop": "secret", "X-Custom": "c"}
        body = {"model": "fake", "prompt": "hi", "max_tokens": 1}
        async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["X-Upstream"] == "yes"
            assert "X-Upstream-Hop" not in resp.headers
        assert seen["headers"]["X-Custom"] == "c"
        assert "X-Hop" not in seen["headers"]
    finally:
        await router.stop()
        await upstream.close()


async def test_an_h2c_upgrade_offer_is_answered_in_http_1_1_and_not_forwarded():
    seen: dict = {}

    async def records(request: web.Request) -> web.StreamResponse:
        seen["headers"] = request.headers.copy()
        return web.json_response({"ok": True})

    upstream = await FakeUpstream(records).start()
    router = await start_router([upstream.address])
    try:
        host, port = router.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        body = b'{"model": "fake", "prompt": "hi", "max_tokens": 1}'
        # What `curl --http2 http://...` sends, then a second request on the same connection.
        offer = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAA\r\n"
        request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
        writer.write(request + offer + b"\r\n" + body + request + b"Connection: close\r\n\r\n" + body)
        text = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert text.count(b"HTTP/1.1 200 OK") == 2
        assert "Upgrade" not in seen["headers"] and "HTTP2-Settings" not in seen["headers"]
    finally:
        await router.stop()
        await upstream.close()


async def test_the_client_limits_of_the_config_reach_the_http_server(cluster):
    limits = {
        "request_head_timeout_s": 1.5,
        "request_body_timeout_s": 2.5,
        "keepalive_timeout_s": 3.5,
        "send_timeout_s": 4.5,
        "max_connections": 7,
        "max_buffered_bytes": 4096,
        "max_header_bytes": 2048,
        "max_header_fields": 20,
        "max_request_target_bytes": 512,
        "max_pipelined_requests": 3,
        "max_concurrent_requests": 5,
    }
    router = await start_router(list(cluster.addresses), gateway=limits)
    try:
        assert router._server is not None
        assert router._server.limits == ServerLimits(
            head_timeout_s=1.5,
            body_timeout_s=2.5,
            keepalive_timeout_s=3.5,
            send_timeout_s=4.5,
            max_connections=7,
            max_buffered_bytes=4096,
            max_head_bytes=2048,
            max_header_fields=20,
            max_target_bytes=512,
            max_pipelined=3,
            max_concurrent_requests=5,
        )
    finally:
        await router.stop()


async def test_limit_hits_are_counted_in_the_gateway_metrics_and_probes_skip_the_request_cap(cluster, http):
    router = await start_router(
        list(cluster.addresses), gateway={"max_request_target_bytes": 256, "max_concurrent_requests": 1}
    )
    try:
        host, port = router.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /v1/models?" + b"a" * 300 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        text = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert text.startswith(b"HTTP/1.1 414")
        assert router._server is not None
        router._server.active = 1  # as if an inference request were being handled
        async with http.get(f"http://{router.address}/v1/models") as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
        for path in ("/health", "/ready"):
            async with http.get(f"http://{router.address}{path}") as r:
                assert r.status == 200
        async with http.get(f"http://{router.address}/metrics") as r:
            metrics = await r.text()
        router._server.active = 0
        assert 'slorouter_http_limit_rejections_total{limit="target_bytes"} 1.0' in metrics
        assert 'slorouter_http_limit_rejections_total{limit="concurrent_requests"} 1.0' in metrics
    finally:
        await router.stop()
