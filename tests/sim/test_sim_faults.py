"""The simulated pod's fault injection: the admin API, the --fault flag, what each fault does on the wire."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from slorouter.faults.kinds import FaultError, parse_fault, parse_fault_flag
from slorouter.faults.plan import FaultPlan
from slorouter.sim import command
from slorouter.sim.faults import FAULTS
from slorouter.sim.server import start_pods

BODY = {"model": "sim-llama3-8b", "prompt": "Hello there", "max_tokens": 4}


@pytest.fixture
async def pod():
    cluster = await start_pods(1, 0, "instant", model="sim-llama3-8b")
    try:
        yield cluster.pods[0]
    finally:
        await cluster.close()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def inject(http, pod, **fault):
    async with http.post(f"http://{pod.address}/admin/faults", json=fault) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


# --- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ([], "JSON object"),
        ({}, "'fault' must name a fault"),
        ({"fault": "explode"}, "unknown fault 'explode'"),
        ({"fault": "hang", "after": 1}, "no parameter 'after'"),
        ({"fault": "hang", "probability": 1.5}, "'probability' must be in 0..1"),
        ({"fault": "hang", "probability": "high"}, "'probability' must be a number"),
        ({"fault": "hang", "count": 0}, "'count' must be in 1"),
        ({"fault": "hang", "count": 1.5}, "whole number"),
        ({"fault": "hang", "after_tokens": True}, "must be a number"),
        ({"fault": "status", "status": 200}, "'status' must be in 400..599"),
        ({"fault": "refuse"}, "needs 'duration_s'"),
        ({"fault": "refuse", "duration_s": 1, "count": 2}, "no probability or count"),
        ({"fault": "metrics-flap", "period_s": float("nan")}, "'period_s' must be in"),
        ({"fault": "kv-events-drop", "replayable": 2}, "'replayable' must be in 0..1"),
        ({"fault": "kv-events-delay"}, "needs 'delay_s'"),
        ({"fault": "kv-events-delay", "delay_s": 0}, "'delay_s' must be in 0.001..3600"),
        ({"fault": "kv-events-reorder", "delay_s": 1}, "no parameter 'delay_s'"),
    ],
)
def test_bad_faults_are_refused_with_a_message_naming_the_key(data, needle):
    with pytest.raises(FaultError, match=needle):
        parse_fault(data, FAULTS)


def test_defaults_and_flag_forms():
    fault = parse_fault({"fault": "kill-mid-stream"}, FAULTS)
    assert (fault.probability, fault.count, fault.params) == (1.0, None, {"after_tokens": 1})
    assert parse_fault_flag("hang,after_tokens=2,count=3", FAULTS).describe() == {
        "fault": "hang",
        "probability": 1.0,
        "count": 3,
        "after_tokens": 2,
        "hits": 0,
    }
    assert parse_fault_flag('{"fault": "status", "status": 503}', FAULTS).params == {"status": 503}
    assert parse_fault_flag("kv-events-drop,probability=0.1", FAULTS).params == {"replayable": 1}
    with pytest.raises(FaultError, match="not key=value"):
        parse_fault_flag("hang,after_tokens", FAULTS)


def test_count_and_probability_decide_who_is_hit():
    plan = FaultPlan(seed=3)
    plan.add(parse_fault({"fault": "status", "count": 2}, FAULTS))
    assert [plan.draw("inference") is not None for _ in range(4)] == [True, True, False, False]
    assert not plan
    plan.add(parse_fault({"fault": "status", "probability": 0.25}, FAULTS))
    hits = sum(plan.draw("inference") is not None for _ in range(2000))
    assert 400 < hits < 600
    assert plan.draw("metrics") is None


async def test_admin_api_validates_lists_and_clears(pod, http):
    url = f"http://{pod.address}/admin/faults"
    async with http.post(url, data=b"{nope") as resp:
        assert resp.status == 400
        assert "not valid JSON" in (await resp.json())["error"]["message"]
    async with http.post(url, json={"fault": "explode"}) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["type"] == "BadRequestError" and "unknown fault" in error["message"]
    await inject(http, pod, fault="status", status=503, count=5)
    await inject(http, pod, fault="metrics-garbage")
    async with http.get(url) as resp:
        assert [f["fault"] for f in (await resp.json())["faults"]] == ["status", "metrics-garbage"]
    async with http.delete(url + "?name=status") as resp:
        assert resp.status == 400
        assert "?fault=NAME" in (await resp.json())["error"]["message"]
    async with http.delete(url + "?fault=status") as resp:
        assert (await resp.json())["cleared"] == 1
    async with http.delete(url) as resp:
        assert (await resp.json()) == {"cleared": 1, "faults": []}


def test_the_flag_is_checked_before_any_pod_starts(capsys):
    import argparse

    root = argparse.ArgumentParser(prog="slorouter")
    command.register(root.add_subparsers(dest="command"))
    args = root.parse_args(["sim", "--port", "0", "--fault", "hang,probability=2"])
    assert command.run(args) == 2
    assert "--fault: 'probability' must be in 0..1" in capsys.readouterr().err


# --- the faults on the wire ---------------------------------------------------------------------------


async def test_status_non_json_and_large_body(pod, http):
    url = f"http://{pod.address}/v1/completions"
    await inject(http, pod, fault="status", status=503, count=1)
    async with http.post(url, json=BODY) as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == 503
    await inject(http, pod, fault="non-json", count=1)
    async with http.post(url, json=BODY) as resp:
        assert resp.status == 200
        assert (await resp.read()).startswith(b"<html>")
    await inject(http, pod, fault="large-body", bytes=300_000, count=1)
    async with http.post(url, json=BODY) as resp:
        body = await resp.read()
        assert len(body) >= 300_000
        assert json.loads(body)["object"] == "text_completion"
    async with http.post(url, json=BODY) as resp:  # every fault was used up
        assert (await resp.json())["usage"]["completion_tokens"] == 4


async def test_truncated_json_and_invalid_sse(pod, http):
    url = f"http://{pod.address}/v1/completions"
    await inject(http, pod, fault="truncated-json", count=2)
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(url, json=BODY) as resp:
            await resp.read()
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(url, json={**BODY, "stream": True}) as resp:
            await resp.read()
    await inject(http, pod, fault="invalid-sse", count=1)
    async with http.post(url, json={**BODY, "stream": True}) as resp:
        assert resp.content_type == "text/event-stream"
        assert b"data:" not in await resp.read()


async def test_kill_mid_stream_sends_the_tokens_then_resets(pod, http):
    url = f"http://{pod.address}/v1/completions"
    await inject(http, pod, fault="kill-mid-stream", after_tokens=2)
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(url, json={**BODY, "max_tokens": 8, "stream": True}) as resp:
            async for chunk in resp.content.iter_any():
                received += chunk
    assert received.count(b"data: ") == 2
    await asyncio.sleep(0.05)
    assert pod.engine.num_running == 0 and pod.engine.num_waiting == 0


async def test_hang_holds_until_the_client_leaves(pod, http):
    url = f"http://{pod.address}/v1/completions"
    await inject(http, pod, fault="hang", count=1)
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(url, json=BODY, timeout=aiohttp.ClientTimeout(total=0.3)) as resp:
            await resp.read()
    await inject(http, pod, fault="hang", after_tokens=1, count=1)
    received = b""
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            url, json={**BODY, "stream": True}, timeout=aiohttp.ClientTimeout(sock_read=0.3)
        ) as resp:
            async for chunk in resp.content.iter_any():
                received += chunk
    assert received.count(b"data: ") == 1
    await asyncio.sleep(0.05)
    assert not pod._active  # the client went away: the pod let the request go


async def test_metrics_faults(pod, http):
    url = f"http://{pod.address}/metrics"
    await inject(http, pod, fault="metrics-garbage", count=1)
    async with http.get(url) as resp:
        assert b"not prometheus" in await resp.read()
    await inject(http, pod, fault="metrics-hang", count=1)
    with pytest.raises(asyncio.TimeoutError):
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=0.3)) as resp:
            await resp.read()
    await inject(http, pod, fault="metrics-flap", period_s=0.2)
    seen = set()
    for _ in range(40):
        async with http.get(url) as resp:
            seen.add(resp.status)
        if seen == {200, 500}:
            break
        await asyncio.sleep(0.02)
    assert seen == {200, 500}


async def test_refuse_drops_connections_then_listens_again(pod, http):
    await inject(http, pod, fault="refuse", duration_s=0.3)
    with pytest.raises(aiohttp.ClientConnectorError):
        async with http.get(f"http://{pod.address}/health") as resp:
            await resp.read()
    for _ in range(100):
        try:
            async with http.get(f"http://{pod.address}/health") as resp:
                assert resp.status == 200
                break
        except aiohttp.ClientConnectorError:
            await asyncio.sleep(0.02)
    else:
        raise AssertionError("the pod did not listen again")
