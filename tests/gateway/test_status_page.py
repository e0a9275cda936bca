"""The gateway's status page, ``GET /v1/router/status``, after real requests to simulated pods."""

from __future__ import annotations

from slorouter.serving.status import STATUS_PATH, decode_status
from slorouter.sim.server import SimCluster


async def test_the_gateway_serves_its_status(cluster: SimCluster, router, http):
    for i in range(3):
        body = {"model": cluster.model, "prompt": f"Hello {i}", "max_tokens": 3}
        headers = {"x-slo-ttft-ms": "60000"}
        async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200
            await r.read()
    async with http.get(f"http://{router.address}{STATUS_PATH}") as resp:
        status = decode_status(await resp.read())
    assert status.front_end == "gateway"
    assert status.requests == 3 and status.routes == {"heuristic": 3}
    assert (status.slo.requests, status.slo.met) == (3, 3)
    assert sorted(e.address for e in status.endpoints) == sorted(cluster.addresses)
    assert sum(e.picks for e in status.endpoints) == 3
    served = [e for e in status.endpoints if e.picks]
    assert all(e.observed_ttft_ms is not None and e.observed_ttft_ms > 0 for e in served)
    assert status.predictor.mode == "off" and status.queued is None
