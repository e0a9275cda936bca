"""``slorouter epp`` with ``tuning.enabled``: the picker's exchanges fill the tuner's window, and its status
page has the tuning section."""

from __future__ import annotations

import aiohttp
import grpc

from slorouter.config import parse_config
from slorouter.extproc.runtime import EndpointPicker, PickerPorts
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

PROMPT = "Summarise the attached contract in plain words, please. " * 8


async def test_the_picker_keeps_the_tuners_window_and_shows_its_tuning(pods: SimCluster) -> None:
    config = parse_config(
        {
            "pool": {"endpoints": list(pods.addresses), "scrape_interval_ms": 20},
            "seed": 7,
            "tuning": {"enabled": True, "interval_s": 3600},
        }
    )
    picker = EndpointPicker.build(config, PickerPorts("127.0.0.1", 0, 0, 0))
    await picker.start()
    assert picker.bound is not None and picker.core.tuning is not None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            for _ in range(3):
                call = open_call(channel)
                await call.send(
                    headers_message(request_headers()), body_message(completion(pods.model, PROMPT))
                )
                await call.receive(2)
                await call.send(response_headers_message())
                await call.receive()
                reply = b'{"choices": [{"text": "fine"}], "usage": {"completion_tokens": 4}}'
                await call.send(response_body_message(reply, True))
                await call.receive()
                await call.end()
        window = picker.core.tuning.window.entries()
        assert len(window) == 3 and all(e.endpoint in pods.addresses and e.output_tokens == 4 for e in window)
        assert window[0].block_hashes == window[1].block_hashes != ()
        assert picker.core.tuning.window.ttfts(0.0, float("inf"))[0] == 3
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{picker.bound.metrics_port}{STATUS_PATH}") as response,
        ):
            status = decode_status(await response.read())
        assert status.tuning is not None and status.tuning.active == "predicted-latency"
        assert status.tuning.worker == "not started" and status.tuning.rounds == 0
    finally:
        await picker.stop()
