"""``slorouter epp --record``: the picker records what it routed and what it rejected, and the file
replays with ``slorouter bench --trace``."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from slorouter.cli import main
from slorouter.config import parse_config
from slorouter.extproc.runtime import EndpointPicker, PickerPorts
from slorouter.serving.recording import RecordSettings
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


async def test_the_picker_records_routed_and_rejected_requests(pods: SimCluster, tmp_path: Path) -> None:
    path = tmp_path / "epp.jsonl"
    config = parse_config({"pool": {"endpoints": list(pods.addresses), "scrape_interval_ms": 20}, "seed": 7})
    picker = EndpointPicker.build(config, PickerPorts("127.0.0.1", 0, 0, 0), record=RecordSettings(path))
    await picker.start()
    assert picker.bound is not None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.bound.grpc_port}") as channel:
            for _ in range(2):
                call = open_call(channel)
                await call.send(
                    headers_message(request_headers(**{"x-slo-tpot-ms": "40"})),
                    body_message(completion(pods.model, PROMPT)),
                )
                await call.receive(2)
                await call.send(response_headers_message())
                await call.receive()
                reply = b'{"choices": [{"text": "fine"}], "usage": {"completion_tokens": 4}}'
                await call.send(response_body_message(reply, True))
                await call.receive()
                await call.end()
            call = open_call(channel)  # a subset hint naming no pod of the pool: answered 503 by the picker
            await call.send(
                headers_message(request_headers(), subset=["10.9.9.9:8000"]),
                body_message(completion(pods.model)),
            )
            await call.receive(2)
            await call.end()
    finally:
        await picker.stop()
    header, *records = [json.loads(line) for line in path.read_text().splitlines()]
    assert header["format"] == "slorouter-trace" and "contract" not in path.read_text()
    routed = [r for r in records if r["status"] == 200]
    assert len(routed) == 2 and all(r["endpoint"] in pods.addresses for r in routed)
    assert all(r["output_tokens"] == 4 and r["slo_tpot_ms"] == 40.0 for r in routed)
    assert routed[0]["block_hashes"] == routed[1]["block_hashes"] != []
    assert [r["status"] for r in records if r["status"] != 200] == [503]

    out = tmp_path / "out"
    argv = ["bench", "--trace", str(path), "--pool", "2", "--policies", "least-request,heuristic",
            "--warmup", "0", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [(run["policy"], run["requests"]) for run in runs] == [("least-request", 3), ("heuristic", 3)]
