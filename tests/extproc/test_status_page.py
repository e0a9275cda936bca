"""The picker's status page, ``GET /v1/router/status`` on its metrics port, after one routed request."""

from __future__ import annotations

import aiohttp

from slorouter.serving.status import STATUS_PATH, decode_status
from slorouter.sim.server import SimCluster
from tests.extproc.conftest import (
    body_message,
    completion,
    headers_message,
    open_call,
    request_headers,
    response_body_message,
    response_headers_message,
)
from tests.gateway.conftest import eventually


async def test_the_picker_serves_its_status_on_the_metrics_port(pods: SimCluster, picker, channel):
    call = open_call(channel)
    await call.send(headers_message(request_headers()), body_message(completion(pods.model)))
    await call.receive(2)
    await call.send(response_headers_message())
    await call.receive()
    await call.send(response_body_message(b'{"usage": {"completion_tokens": 4}}', True))
    await call.receive()
    await call.end()
    await eventually(lambda: int(picker.core.pool.columns["inflight_requests"].sum()) == 0)
    assert picker.bound is not None
    url = f"http://127.0.0.1:{picker.bound.metrics_port}{STATUS_PATH}"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        status = decode_status(await resp.read())
    assert status.front_end == "picker" and status.requests == 1
    assert sum(e.picks for e in status.endpoints) == 1
