"""The priority the gateway sends to the model servers (``pool.engine_priority``): what reaches a recording
upstream, in each server's form, on the first attempt and on a retry elsewhere."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.gateway.conftest import IDLE_SGLANG_METRICS, FakeUpstream, Recorder, start_router

OBJECTIVES = {"critical": {"priority": 5}, "batch": {"priority": -1, "engine_priority": -3}}


async def _post(http: aiohttp.ClientSession, address: str, body: dict[str, Any], **headers: str) -> None:
    async with http.post(f"http://{address}/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


async def test_the_body_carries_the_priority_in_the_vllm_form(http):
    recorder = Recorder()
    upstream = await FakeUpstream(recorder.handle).start()
    pool = {"model_server_type": "vllm", "engine_priority": True}
    router = await start_router([upstream.address], pool=pool, objectives=OBJECTIVES)
    try:
        body = {"model": "fake", "prompt": "hi", "max_tokens": 4}
        await _post(http, router.address, body, **{"x-gateway-inference-objective": "critical"})
        await _post(http, router.address, body, **{"x-gateway-inference-objective": "batch"})
        await _post(http, router.address, body)
        # The client's own priority is replaced (the slow path), never sent twice.
        await _post(
            http, router.address, {**body, "priority": -100}, **{"x-llm-d-inference-objective": "batch"}
        )
        sent = [r.json.pop("priority") for r in recorder.received]
        assert sent == [-5, 3, 0, 3]  # vLLM runs lower values first: the objective's priority negated
        assert all(r.json == {**body, "priority": p} for r, p in zip(recorder.received, sent, strict=True))
        assert all(r.content_length == len(r.body) for r in recorder.received)
        first = recorder.received[0].body
        assert (
            first.startswith(b'{"priority":-5,')
            and first[len(b'{"priority":-5,') :] == json.dumps(body).encode()[1:]
        )  # the client's bytes follow the field unchanged
        assert recorder.received[3].body.count(b'"priority"') == 1
    finally:
        await router.stop()
        await upstream.close()


async def test_nothing_is_sent_unless_configured(http):
    recorder = Recorder()
    upstream = await FakeUpstream(recorder.handle).start()
    router = await start_router([upstream.address], objectives={"critical": {"priority": 5}})
    try:
        raw = b'{"model": "fake", "prompt": "hi", "priority": 7}'
        headers = {"content-type": "application/json", "x-gateway-inference-objective": "critical"}
        async with http.post(f"http://{router.address}/v1/completions", data=raw, headers=headers) as resp:
            assert resp.status == 200
        assert [r.body for r in recorder.received] == [raw]  # byte for byte the client's
    finally:
        await router.stop()
        await upstream.close()


async def test_each_endpoint_of_a_mixed_pool_gets_its_form(http):
    vllm, sglang = Recorder(), Recorder()
    upstreams = [
        await FakeUpstream(vllm.handle).start(),
        await FakeUpstream(sglang.handle, IDLE_SGLANG_METRICS).start(),
    ]
    pool = {
        "engine_priority": True,
        "endpoints": [
            {"address": upstreams[0].address, "model_server_type": "vllm"},
            {"address": upstreams[1].address, "model_server_type": "sglang"},
        ],
    }
    router = await start_router([], pool=pool, objectives=OBJECTIVES)
    try:
        body = {"model": "fake", "prompt": "hi", "max_tokens": 4}
        for i in range(40):
            objective = ("critical", "batch")[i % 2]
            request = {**body, "prompt": f"request {i}"}  # no prefix affinity to one endpoint
            await _post(http, router.address, request, **{"x-gateway-inference-objective": objective})
            if len(vllm.received) >= 2 and len(sglang.received) >= 2:
                break
        assert {r.json["priority"] for r in vllm.received} <= {-5, 3}
        assert {r.json["priority"] for r in sglang.received} <= {5, -3}  # SGLang: higher first, as is
        assert vllm.received and sglang.received
    finally:
        await router.stop()
        for upstream in upstreams:
            await upstream.close()


async def test_a_retry_on_another_engine_carries_that_engines_form(http):
    failing, serving = Recorder(fail=True), Recorder()
    upstreams = [
        await FakeUpstream(failing.handle, IDLE_SGLANG_METRICS).start(),
        await FakeUpstream(serving.handle).start(),
    ]
    pool = {
        "engine_priority": True,
        "endpoints": [
            {"address": upstreams[0].address, "model_server_type": "sglang"},
            {"address": upstreams[1].address, "model_server_type": "vllm"},
        ],
    }
    router = await start_router([], pool=pool, objectives=OBJECTIVES)
    try:
        body = {"model": "fake", "prompt": "hi", "max_tokens": 4}
        for i in range(30):  # until the failing SGLang endpoint was picked first
            headers = {"x-gateway-inference-objective": "critical", "x-request-id": f"r{i}"}
            await _post(http, router.address, {**body, "prompt": f"attempt {i}"}, **headers)
            if failing.received:
                break
        (first,) = failing.received
        (retried,) = [r for r in serving.received if r.request_id == first.request_id]
        assert first.json["priority"] == 5 and retried.json["priority"] == -5
    finally:
        await router.stop()
        for upstream in upstreams:
            await upstream.close()
