"""The audit section on the picker (in-process, over a real gRPC channel): the candidates' scores in the
``envoy.lb`` dynamic metadata beside the destination, the scores header in the response headers, routing
regret on the status page; none of it when the section is off."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest

from slorouter.extproc import messages
from slorouter.extproc.runtime import EndpointPicker
from slorouter.serving.scores_header import ENDPOINT_SCORES_KEY
from slorouter.serving.status import STATUS_PATH, decode_status
from slorouter.sim.server import SimCluster
from tests.extproc import conftest as envoy
from tests.gateway.conftest import eventually


@pytest.fixture
async def audited(pods: SimCluster) -> AsyncIterator[EndpointPicker]:
    running = await envoy.start_picker(list(pods.addresses), audit={"regret": True, "scores_header": True})
    try:
        yield running
    finally:
        await running.stop()


async def _one_request(
    picker: EndpointPicker, model: str
) -> tuple[messages.ProcessingResponse, dict[str, str]]:
    """One request routed and answered over the in-band path: the routing answer and the response headers
    the picker set."""
    assert picker.bound is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
        call = envoy.open_call(channel)
        await call.send(
            envoy.headers_message(envoy.request_headers()), envoy.body_message(envoy.completion(model))
        )
        answers = await call.receive(2)
        (routed,) = [a for a in answers if messages.LB_NAMESPACE in a.dynamic_metadata.fields]
        await call.send(envoy.response_headers_message())
        (answer,) = await call.receive()
        await call.send(envoy.response_body_message(b'{"usage": {"completion_tokens": 4}}', True))
        await call.receive()
        await call.end()
    await eventually(lambda: int(picker.core.pool.columns["inflight_requests"].sum()) == 0)
    return routed, envoy.set_headers(answer.response_headers.response.header_mutation)


async def test_scores_in_the_dynamic_metadata_and_the_response_headers(pods: SimCluster, audited):
    routed, headers = await _one_request(audited, pods.model)
    lb = routed.dynamic_metadata.fields[messages.LB_NAMESPACE].struct_value.fields
    destination = lb[messages.DESTINATION].string_value
    scores = {k: v.number_value for k, v in lb[ENDPOINT_SCORES_KEY].struct_value.fields.items()}
    assert set(scores) == set(pods.addresses)  # the default profile filters none out
    assert scores[destination] == max(scores.values())
    assert headers["x-slorouter-endpoint"] == destination
    listed = headers["x-slorouter-scores"].split(",")
    assert len(listed) == 3 and listed[0].startswith(f"{destination};score=")
    assert headers["x-slorouter-runner-up"] == listed[1].split(";")[0]
    assert audited.bound is not None
    url = f"http://127.0.0.1:{audited.bound.metrics_port}{STATUS_PATH}"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        status = decode_status(await resp.read())
    assert status.regret is not None and status.regret.picks == 1


async def test_no_scores_when_the_section_is_off(pods: SimCluster, picker):
    routed, headers = await _one_request(picker, pods.model)
    assert (
        ENDPOINT_SCORES_KEY not in routed.dynamic_metadata.fields[messages.LB_NAMESPACE].struct_value.fields
    )
    assert not any(name.startswith("x-slorouter-scores") for name in headers)
