"""Deadlines and hedged requests through the gateway, against scripted model servers on 127.0.0.1
(``tests.helpers.scripted``: each test scripts the first call, the second (the hedged copy) and so on)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from slorouter.gateway.runtime import Router
from tests.gateway.conftest import eventually, start_router
from tests.helpers.scripted import (
    Scripted,
    answer_after,
    fail_after,
    hang,
    once_copied,
    slow_stream,
    stream_then_hang,
)

OBJECTIVES = {
    "interactive": {"priority": 1, "deadline": {"action": "hedge"}},
    "batch": {"priority": -1, "deadline": {"action": "cancel", "tpot": True, "tpot_min_tokens": 3}},
    "plain": {"priority": 1},
}
HEDGING = {"max_slo_share": 0.5, "min_delay_ms": 0, "max_share": 1.0, "burst": 10}
BODY = {"model": "fake", "prompt": "hi", "max_tokens": 4}


def _inflight(router) -> int:
    return int(router.pool.columns["inflight_requests"].sum())


def _headers(objective: str, slo_ms: float, **more: str) -> dict[str, str]:
    return {"x-gateway-inference-objective": objective, "x-slo-ttft-ms": str(slo_ms), **more}


async def _metric(http: aiohttp.ClientSession, router, name: str) -> dict[str, float]:
    async with http.get(f"http://{router.address}/metrics") as resp:
        text = await resp.text()
    found = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, value = line.rsplit(" ", 1)
            if float(value):  # every series of a configured objective is there from the start, at 0
                found[key] = float(value)
    return found


@contextlib.asynccontextmanager
async def _routed(scripted: Scripted, **overrides: Any) -> AsyncIterator[Router]:
    """The scripted servers started, and a gateway in front of them with the test's objectives; both stop
    at the end."""
    await scripted.start()
    settings = {"objectives": OBJECTIVES, "hedging": HEDGING, **overrides}
    router = await start_router(scripted.addresses, **settings)
    try:
        yield router
    finally:
        await router.stop()
        await scripted.close()


async def test_a_stalled_request_is_hedged_and_the_copy_wins(http):
    scripted = Scripted(hang, answer_after(0.0, "copy"))
    async with _routed(scripted) as router:
        url = f"http://{router.address}/v1/completions"
        async with http.post(url, json=BODY, headers=_headers("interactive", 200)) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["text"] == "copy"
            served_by = resp.headers["x-slorouter-endpoint"]
        assert scripted.calls == 2
        await eventually(lambda: scripted.closed == [0])  # the stalled original was cancelled
        assert served_by == scripted.called[1] != scripted.called[0]  # the copy's, on the other server
        await eventually(lambda: _inflight(router) == 0)
        hedges = await _metric(http, router, "slorouter_hedges_total")
        assert hedges['slorouter_hedges_total{objective="interactive",outcome="sent"}'] == 1
        assert hedges['slorouter_hedges_total{objective="interactive",outcome="won"}'] == 1
        tokens = await _metric(http, router, "slorouter_hedge_loser_prefill_tokens_total")
        assert next(iter(tokens.values())) > 0
        status = router.core.status("gateway").deadlines
        assert status is not None
        assert status.objectives["interactive"].hedges == {
            "sent": 1,
            "won": 1,
            "lost": 0,
            "failed": 0,
            "cancelled": 0,
        }


async def test_the_original_wins_when_it_answers_first_and_the_copy_is_cancelled(http):
    scripted = Scripted(once_copied(answer_after(0.0, "original")), hang)
    async with _routed(scripted) as router:
        url = f"http://{router.address}/v1/completions"
        async with http.post(url, json=BODY, headers=_headers("interactive", 200)) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["text"] == "original"
        await eventually(lambda: scripted.closed == [1])
        await eventually(lambda: _inflight(router) == 0)
        hedges = await _metric(http, router, "slorouter_hedges_total")
        assert hedges['slorouter_hedges_total{objective="interactive",outcome="lost"}'] == 1


async def test_both_copies_failing_gives_one_502_and_counts_failed(http):
    scripted = Scripted(once_copied(fail_after(0.0)), fail_after(0.0))
    async with _routed(scripted) as router:
        url = f"http://{router.address}/v1/completions"
        async with http.post(url, json=BODY, headers=_headers("interactive", 200)) as resp:
            assert resp.status == 502
            assert "failed before responding" in (await resp.json())["error"]["message"]
        assert scripted.calls == 2  # the two copies; no endpoint is left for a retry
        await eventually(lambda: _inflight(router) == 0)
        hedges = await _metric(http, router, "slorouter_hedges_total")
        assert hedges['slorouter_hedges_total{objective="interactive",outcome="failed"}'] == 1


async def test_when_the_original_fails_after_the_hedge_the_copy_answers_and_wins(http):
    failed = asyncio.Event()

    async def fail_once_copied(scripted: Scripted, index: int, request: web.Request) -> web.Response:
        await eventually(lambda: scripted.calls >= 2)
        assert request.transport is not None
        request.transport.abort()
        failed.set()
        return web.Response(status=500)

    async def answer_after_the_failure(scripted: Scripted, index: int, request: web.Request) -> web.Response:
        await failed.wait()
        await asyncio.sleep(0.05)  # the router sees the original's failure first
        return web.json_response({"choices": [{"index": 0, "text": "copy"}]})

    scripted = Scripted(fail_once_copied, answer_after_the_failure)
    async with _routed(scripted) as router:
        url = f"http://{router.address}/v1/completions"
        async with http.post(url, json=BODY, headers=_headers("interactive", 200)) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["text"] == "copy"
        await eventually(lambda: _inflight(router) == 0)
        hedges = await _metric(http, router, "slorouter_hedges_total")
        assert hedges == {
            'slorouter_hedges_total{objective="interactive",outcome="sent"}': 1.0,
            'slorouter_hedges_total{objective="interactive",outcome="won"}': 1.0,
        }


async def test_a_client_that_leaves_while_a_hedge_races_cancels_both_copies(http):
    scripted = Scripted(hang, hang)
    async with _routed(scripted) as router:
        url = f"http://{router.address}/v1/completions"
        with pytest.raises(asyncio.TimeoutError):
            timeout = aiohttp.ClientTimeout(total=0.5)
            await http.post(url, json=BODY, headers=_headers("interactive", 200), timeout=timeout)
        await eventually(lambda: sorted(scripted.closed) == [0, 1])
        await eventually(lambda: _inflight(router) == 0)
        hedges = await _metric(http, router, "slorouter_hedges_total")
        assert hedges['slorouter_hedges_total{objective="interactive",outcome="cancelled"}'] == 1


async def test_no_hedge_beyond_the_budget_and_none_for_an_objective_without_a_deadline(http):
    scripted = Scripted(answer_after(0.5, "slow"))
    async with _routed(scripted, hedging={**HEDGING, "max_share": 0.0}) as router:
        url = f"http://{router.address}/v1/completions"
        for objective in ("interactive", "plain"):
            async with http.post(url, json=BODY, headers=_headers(objective, 100)) as resp:
                assert resp.status == 200
        assert scripted.calls == 2  # one call per request: nothing hedged
        skipped = await _metric(http, router, "slorouter_hedges_skipped_total")
        assert skipped == {'slorouter_hedges_skipped_total{objective="interactive",reason="budget"}': 1.0}


async def test_a_sheddable_request_past_its_deadline_is_cancelled_with_an_error_naming_the_slo(http):
    scripted = Scripted(hang)
    async with _routed(scripted) as router:
        url = f"http://{router.address}/v1/completions"
        for stream in (False, True):
            body = {**BODY, "stream": stream}
            async with http.post(url, json=body, headers=_headers("batch", 150)) as resp:
                assert resp.status == 504
                error = (await resp.json())["error"]
            assert error["code"] == "deadline_exceeded"
            assert "TTFT SLO of 150 ms" in error["message"] and "'batch'" in error["message"]
        await eventually(lambda: sorted(scripted.closed) == [0, 1])  # the engine's slots are freed
        await eventually(lambda: _inflight(router) == 0)
        cancelled = await _metric(http, router, "slorouter_deadline_cancellations_total")
        assert cancelled == {'slorouter_deadline_cancellations_total{objective="batch",slo="ttft"}': 2.0}


async def test_a_stream_slower_than_its_tpot_slo_is_cut_with_an_error_event(http):
    scripted = Scripted(slow_stream(50, 0.05))
    async with _routed(scripted) as router:
        url = f"http://{router.address}/v1/completions"
        body = {**BODY, "stream": True, "max_tokens": 50}
        headers = _headers("batch", 1000, **{"x-slo-tpot-ms": "10"})
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 200
            text = (await resp.read()).decode()
        events = [e for e in text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["code"] == "deadline_exceeded" and "TPOT" in error["message"]
        assert 3 <= text.count('"text"') < 10
        await eventually(lambda: _inflight(router) == 0)
        cancelled = await _metric(http, router, "slorouter_deadline_cancellations_total")
        assert cancelled == {'slorouter_deadline_cancellations_total{objective="batch",slo="tpot"}': 1.0}


ROUND_ROBIN = {
    "plugins": [{"type": "round-robin-picker"}],
    "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "round-robin-picker"}]}],
}


async def test_a_request_on_a_server_that_stopped_mid_stream_is_hedged_long_before_its_delay(http):
    # Round robin: a stream goes to one server and stops after two tokens; a plain request goes to the other;
    # the hedgeable request goes where the stream stopped. Its SLO puts its hedge delay at 2.5 s, but the
    # server has been silent for 200 ms (the stall floor) with a request decoding: its copy goes at once.
    scripted = Scripted(
        stream_then_hang(2, 0.02), answer_after(0.0, "plain"), hang, answer_after(0.0, "copy")
    )
    hedging = {**HEDGING, "stall_ms": 200}
    async with _routed(scripted, scheduler=ROUND_ROBIN, hedging=hedging) as router:
        url = f"http://{router.address}/v1/completions"
        stalled = await http.post(url, json={**BODY, "stream": True, "max_tokens": 50})
        try:
            assert stalled.status == 200
            await stalled.content.readuntil(b"\n\n")
            await stalled.content.readuntil(b"\n\n")
            async with http.post(url, json=BODY) as resp:
                assert (await resp.json())["choices"][0]["text"] == "plain"
            started = asyncio.get_running_loop().time()
            async with http.post(url, json=BODY, headers=_headers("interactive", 5000)) as resp:
                assert (await resp.json())["choices"][0]["text"] == "copy"
            assert asyncio.get_running_loop().time() - started < 1.5
        finally:
            stalled.close()
        assert scripted.called[2] == scripted.called[0] != scripted.called[3]
        await eventually(lambda: 2 in scripted.closed)  # the stalled original was cancelled
        hedges = await _metric(http, router, "slorouter_hedges_total")
        assert hedges['slorouter_hedges_total{objective="interactive",outcome="won"}'] == 1
        stalls = await _metric(http, router, "slorouter_stall_hedges_total")
        assert stalls == {'slorouter_stall_hedges_total{objective="interactive"}': 1}
