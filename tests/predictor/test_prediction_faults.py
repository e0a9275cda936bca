"""The prediction server's injected faults (``enable_fault_injection``) against the router's client, in one
process on 127.0.0.1: what each fault makes ``predict`` raise, and the circuit breaker that stops the calls.
The gateway-level tests are tests/reliability/test_predictor_faults.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from slorouter.predictor.backend import PredictionUnavailable
from slorouter.predictor.breaker import BreakerConfig, BreakerState
from slorouter.predictor.model_sources import make_source
from slorouter.predictor.prediction_client import PredictionClient
from slorouter.predictor.prediction_server import PredictionServer
from slorouter.predictor.wire import check_predictions
from tests.helpers import predictor_models as common
from tests.helpers.predictor_models import eventually, union

trained_dir = common.trained_dir


@pytest.fixture
async def server(trained_dir: Path) -> AsyncIterator[PredictionServer]:
    server = PredictionServer(
        make_source(model_dir=str(trained_dir)), poll_interval_s=0.05, enable_fault_injection=True
    )
    await server.start(port=0)
    await eventually(lambda: server.ready)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def inject(http: aiohttp.ClientSession, server: PredictionServer, **fault: Any) -> dict[str, Any]:
    async with http.post(f"{server.url}/admin/faults", json=fault) as resp:
        body: dict[str, Any] = await resp.json()
        assert resp.status == 200, body
        return body


def hits(server: PredictionServer) -> int:
    assert server.faults is not None
    return sum(int(f["hits"]) for f in server.faults.describe())


async def test_fault_injection_is_off_unless_enabled(trained_dir: Path, http: aiohttp.ClientSession) -> None:
    plain = PredictionServer(make_source(model_dir=str(trained_dir)))
    await plain.start(port=0)
    try:
        async with http.post(f"{plain.url}/admin/faults", json={"fault": "hang"}) as resp:
            assert resp.status == 404
        assert plain.status()["faults"] is None
    finally:
        await plain.stop()


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"fault": "explode"}, "unknown fault 'explode'"),
        ({"fault": "delay"}, "needs 'delay_ms'"),
        ({"fault": "delay", "delay_ms": -1}, "'delay_ms' must be in"),
        ({"fault": "status", "status": 200}, "'status' must be in 400..599"),
        ({"fault": "nan", "after_tokens": 1}, "no parameter 'after_tokens'"),
        ([1], "must be a JSON object"),
    ],
)
async def test_bad_fault_descriptions_get_400_naming_the_problem(
    server: PredictionServer, http: aiohttp.ClientSession, fault: Any, message: str
) -> None:
    async with http.post(f"{server.url}/admin/faults", json=fault) as resp:
        assert resp.status == 400
        assert message in (await resp.json())["error"]["message"]
    async with http.get(f"{server.url}/admin/faults") as resp:
        assert (await resp.json())["faults"] == []


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize(
    ("fault", "reason", "detail"),
    [
        ({"fault": "nan"}, "malformed", "TTFT prediction is nan"),
        ({"fault": "inf"}, "malformed", None),
        ({"fault": "negative"}, "malformed", "TTFT prediction is -1.0"),
        ({"fault": "malformed"}, "malformed", "malformed response"),
        ({"fault": "status", "status": 502}, "server-error", "HTTP 502"),
        ({"fault": "hang"}, "timeout", "within 500 ms"),
        ({"fault": "delay", "delay_ms": 2000}, "timeout", "within 500 ms"),
    ],
    ids=lambda v: v["fault"] if isinstance(v, dict) else None,
)
async def test_each_fault_makes_predict_raise_prediction_unavailable_with_its_reason(
    server: PredictionServer,
    http: aiohttp.ClientSession,
    fault: dict[str, Any],
    reason: str,
    detail: str | None,
    binary: bool,
) -> None:
    healthy = PredictionClient([server.url], timeout_s=10.0, coalesce_window_s=0, binary=binary)
    healthy.start()
    try:
        ttft, _ = await healthy.predict(union(3))
        assert np.isfinite(ttft).all()
    finally:
        await healthy.stop()
    # The client's 500 ms tell a hung or delayed server; a fault answered at once gets a timeout that a loaded
    # machine cannot reach, so that its reason, not the machine's speed, is what the test sees.
    timeout_s = 0.5 if reason == "timeout" else 10.0
    client = PredictionClient([server.url], timeout_s=timeout_s, coalesce_window_s=0, binary=binary)
    client.start()
    try:
        await inject(http, server, **fault)
        with pytest.raises(PredictionUnavailable) as raised:
            await client.predict(union(3))
        assert raised.value.reason == reason
        assert detail is None or detail in str(raised.value), str(raised.value)
        assert hits(server) == 1
    finally:
        await client.stop()


def test_check_predictions_refuses_non_finite_and_negative_latencies() -> None:
    check_predictions(np.array([1.0, 0.0]), np.array([np.nan, 2.0]))  # NaN TPOT: no TPOT model yet
    for ttft, tpot in [
        ([np.nan], [1.0]),
        ([np.inf], [1.0]),
        ([-0.5], [1.0]),
        ([1.0], [np.inf]),
        ([1.0], [-np.inf]),
        ([1.0], [-2.0]),
    ]:
        with pytest.raises(ValueError, match="must be finite and >= 0"):
            check_predictions(np.array(ttft), np.array(tpot))


def breaker_state(registry: CollectorRegistry) -> str:
    states = [s for s in BreakerState if registry.get_sample_value(
        "slorouter_prediction_breaker_state", {"state": s.value}) == 1]  # fmt: skip
    assert len(states) == 1, states
    return states[0].value


async def test_the_breaker_opens_stops_the_calls_and_closes_once_the_fault_is_cleared(
    server: PredictionServer, http: aiohttp.ClientSession
) -> None:
    registry = CollectorRegistry()
    client = PredictionClient(
        [server.url],
        timeout_s=0.5,
        coalesce_window_s=0,
        registry=registry,
        breaker=BreakerConfig(failures=3, latency_budget_s=0.5, cooldown_s=0.3, max_cooldown_s=0.6),
    )
    client.start()
    loop = asyncio.get_running_loop()
    try:
        await client.predict(union(2))
        assert breaker_state(registry) == "closed"
        await inject(http, server, fault="hang")
        reasons = []
        for _ in range(3):
            with pytest.raises(PredictionUnavailable) as raised:
                await client.predict(union(2))
            reasons.append(raised.value.reason)
        assert reasons == ["timeout"] * 3
        assert client.breaker.state is BreakerState.OPEN and breaker_state(registry) == "open"
        struck = hits(server)
        # Open: every call is refused at once, without a request (the hung server sees none).
        started = loop.time()
        for _ in range(20):
            with pytest.raises(PredictionUnavailable) as raised:
                await client.predict(union(2))
            assert raised.value.reason == "breaker-open"
        assert loop.time() - started < 0.5 * 20 / 2  # no timeout waited (a bound, not a speed)
        assert hits(server) == struck
        calls = "slorouter_prediction_client_calls_total"
        assert registry.get_sample_value(calls, {"outcome": "breaker_open"}) == 20
        # Half-open after the cool-down: one probe reaches the still-hung server, fails, and it reopens.
        await asyncio.sleep(0.35)  # the cool-down (0.3 s)
        with pytest.raises(PredictionUnavailable):
            await client.predict(union(2))
        assert hits(server) == struck + 1 and client.breaker.state is BreakerState.OPEN
        # The fault cleared: the next probe succeeds and closes it; predictions flow again.
        async with http.delete(f"{server.url}/admin/faults") as resp:
            assert resp.status == 200

        async def predicted() -> bool:
            try:
                await client.predict(union(2))
            except PredictionUnavailable:
                await asyncio.sleep(0.05)
                return False
            return True

        await eventually(predicted, timeout=10)
        assert client.breaker.state is BreakerState.CLOSED and breaker_state(registry) == "closed"
        transitions = {
            state: registry.get_sample_value(
                "slorouter_prediction_breaker_transitions_total", {"state": state}
            )
            for state in ("open", "half-open", "closed")
        }
        assert transitions["open"] == 2 and transitions["half-open"] == 2 and transitions["closed"] == 1
    finally:
        await client.stop()
    assert not client._tasks


async def test_a_slow_server_opens_the_breaker_by_its_p99(
    server: PredictionServer, http: aiohttp.ClientSession
) -> None:
    client = PredictionClient(
        [server.url],
        timeout_s=2.0,
        coalesce_window_s=0,
        breaker=BreakerConfig(failures=100, latency_budget_s=0.05, window=20, min_exchanges=5),
    )
    client.start()
    try:
        await inject(http, server, fault="delay", delay_ms=100)
        for _ in range(5):
            await client.predict(union(1))  # every answer arrives, each slower than the budget
        assert client.breaker.state is BreakerState.OPEN
        assert "p99" in (client.breaker.last_reason or "")
        with pytest.raises(PredictionUnavailable) as raised:
            await client.predict(union(1))
        assert raised.value.reason == "breaker-open"
    finally:
        await client.stop()
