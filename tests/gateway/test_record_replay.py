"""Recording a gateway's traffic (``--record``) and replaying it with ``slorouter bench --trace``."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from slorouter.cli import main
from slorouter.config import parse_config
from slorouter.gateway.runtime import Router
from slorouter.scheduling.plugin import Admitter, Plugin
from slorouter.scheduling.types import AdmissionDeniedError, Candidates, InferenceRequest
from slorouter.serving.recording import RecordSettings
from slorouter.sim.server import start_pods

SHARED = "You are a careful assistant. Answer briefly and cite the manual. " * 8  # 128 tokens


class _ShedSheddable(Plugin, Admitter):
    """Sheds every sheddable request."""

    type_name = "test-shed-sheddable"

    def admit(self, request: InferenceRequest, candidates: Candidates) -> None:
        if request.sheddable:
            raise AdmissionDeniedError("sheddable request dropped")


async def _record(path: Path) -> list[int]:
    """Serve a few requests through a recording gateway over two simulated pods; their statuses."""
    pods = await start_pods(2, 0, "llama3-8b-h100", seed=1)
    config = parse_config(
        {
            "gateway": {"host": "127.0.0.1", "port": 0},
            "pool": {"endpoints": list(pods.addresses), "scrape_interval_ms": 20},
            "objectives": {"batch": {"priority": -1}},
            "seed": 7,
        }
    )
    router = Router.build(config, record=RecordSettings(path))
    router.director.setup.admitters.append(_ShedSheddable("shed", None, None))  # type: ignore[arg-type]
    statuses = []
    try:
        await router.start()
        url = f"http://{router.address}"
        async with aiohttp.ClientSession() as http:
            for i in range(3):  # completions sharing a long prefix, one with a TTFT target
                headers = {"x-slo-ttft-ms": "800"} if i == 0 else {}
                body = {"model": pods.model, "prompt": SHARED + f"question {i}?", "max_tokens": 8}
                async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
                    statuses.append(resp.status)
                    await resp.read()
            chat = {
                "model": pods.model,
                "messages": [{"role": "user", "content": SHARED}],
                "max_tokens": 6,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with http.post(f"{url}/v1/chat/completions", json=chat) as resp:
                statuses.append(resp.status)
                await resp.read()
            shed = {"x-gateway-inference-objective": "batch"}
            body = {"model": pods.model, "prompt": "later", "max_tokens": 4}
            async with http.post(f"{url}/v1/completions", json=body, headers=shed) as resp:
                statuses.append(resp.status)
                await resp.read()
            async with http.post(f"{url}/v1/completions", json={"prompt": "no model"}) as resp:
                statuses.append(resp.status)  # not a request the router could parse: not recorded
    finally:
        await router.stop()
        await pods.close()
    return statuses


def test_a_recorded_gateway_replays_under_every_policy(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "traffic.jsonl"
    assert asyncio.run(_record(path)) == [200, 200, 200, 200, 429, 400]
    header, *records = [json.loads(line) for line in path.read_text().splitlines()]
    assert header["format"] == "slorouter-trace"
    assert "careful assistant" not in path.read_text()
    assert len(records) == 5
    by_status: dict[int, list[dict]] = {}
    for record in records:
        by_status.setdefault(record["status"], []).append(record)
    answered = sorted(by_status[200], key=lambda r: r["arrival"])
    assert [r["api"] for r in answered] == ["completions"] * 3 + ["chat"]
    assert all(r["ttft_ms"] > 0 and r["endpoint"] for r in answered)
    assert [r["output_tokens"] for r in answered[:3]] == [8] * 3  # from the responses' usage
    assert answered[0]["slo_ttft_ms"] == 800.0 and answered[3]["stream"] is True
    assert answered[3]["tpot_ms"] > 0 and answered[3]["output_tokens"] == 6
    completions = [r["block_hashes"] for r in answered[:3]]
    assert (
        len(completions[0]) == 8 and completions[0] == completions[1] == completions[2]
    )  # 128 shared tokens
    (shed,) = by_status[429]
    assert shed["priority"] == -1 and shed["objective"] == "batch" and shed["endpoint"] is None

    out = tmp_path / "out"
    policies = ["round-robin", "heuristic"]
    argv = ["bench", "--trace", str(path), "--pool", "2", "--policies", ",".join(policies),
            "--warmup", "0", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [run["policy"] for run in runs] == policies
    assert all(run["workload"] == "trace-traffic" and run["requests"] == 5 for run in runs)
    table = (out / "results.md").read_text()
    assert all(f"| {policy} |" in table for policy in policies)
