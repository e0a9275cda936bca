"""The simulated server's cheap paths give exactly what the plain ones give."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np
import pytest

from slorouter.sim.profiles import PROFILES
from slorouter.sim.protocol import GenerationRequest, response_body, response_json
from slorouter.sim.server import POD_HEADER, _zero_cost, start_pods


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("model", ["sim-instant", 'we"ird\\model', "modèle ✓"])
def test_response_json_is_json_dumps_of_the_body_byte_for_byte(chat, model):
    rng = np.random.default_rng(0)
    for _ in range(50):
        prompt = np.zeros(int(rng.integers(1, 500)), dtype="<u4")
        request = GenerationRequest(chat, model, prompt, int(rng.integers(1, 400)), False, False)
        args = (
            "cmpl-" + "ab" * 16,
            int(rng.integers(0, 2**31)),
            int(rng.integers(1, 400)),
            int(rng.integers(0, 9)),
        )
        assert response_json(request, *args) == json.dumps(response_body(request, *args)).encode()


def test_only_the_instant_profile_is_zero_cost():
    assert [name for name, profile in PROFILES.items() if _zero_cost(profile)] == ["instant"]


async def test_instant_pod_answers_many_concurrent_requests_inline():
    """Zero-cost pods step the engine from a loop callback; concurrent and streamed requests all finish."""
    async with await start_pods(1, 0, "instant", model="tiny") as cluster:
        pod = cluster.pods[0]
        url = f"http://{cluster.addresses[0]}/v1/completions"
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> dict:
                body = {"prompt": f"hello {i}", "max_tokens": 1 + i % 3, "stream": i % 4 == 0}
                async with session.post(url, json=body) as response:
                    assert response.status == 200
                    assert response.headers[POD_HEADER] == pod.name
                    return {"text": await response.text()}

            results = await asyncio.gather(*(one(i) for i in range(40)))
        assert len(results) == 40
        assert not pod.engine.has_work() and pod.engine.kv_usage == 0
        assert pod.engine.num_finished_total == 40
