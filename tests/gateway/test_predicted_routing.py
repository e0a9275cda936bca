"""Predicted-latency routing end to end: simulated pods, the gateway and the embedded predictor."""

from __future__ import annotations

import asyncio
import copy

import pytest

from slorouter.scheduling.pipelines import PREDICTED_LATENCY_SCHEDULER_CONFIG
from slorouter.serving.status import STATUS_PATH, decode_status
from tests.gateway.conftest import eventually, start_router

FAST_TRAINING = {"min_samples": 30, "retrain_interval_s": 0.2, "n_estimators": 30, "max_depth": 4}


def _predictor(**embedded):
    return {"mode": "embedded", "prediction_by_default": True, "embedded": {**FAST_TRAINING, **embedded}}


async def _warm_up(http, router, model, n=64, stream=False):
    """Varied traffic until the predictor has trained on it."""

    async def one(i):
        body = {"model": model, "prompt": f"request {i} " + "words " * (5 + 40 * (i % 7)),
                "max_tokens": 2 + i % 5, "stream": stream}  # fmt: skip
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
            return resp.headers["x-slorouter-route"]

    routes = []
    for start in range(0, n, 8):
        routes += await asyncio.gather(*(one(i) for i in range(start, start + 8)))
    await eventually(lambda: router.predictor.ready, timeout=60)
    return routes


async def test_requests_are_routed_by_prediction_once_the_model_is_trained(cluster, http):
    router = await start_router(list(cluster.addresses), predictor=_predictor())
    try:
        routes = await _warm_up(http, router, cluster.model)
        assert routes[0] == "fallback"  # warming up: heuristics
        body = {"model": cluster.model, "prompt": "what now?", "max_tokens": 3}
        async with http.post(f"http://{router.address}/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["x-slorouter-route"] in ("predicted", "explore")
            assert float(resp.headers["x-slorouter-predicted-ttft-ms"]) > 0
            assert "x-slorouter-predicted-tpot-ms" not in resp.headers  # TPOT is not modelled (E2E mode)
        # Opting out routes by the heuristic profile.
        headers = {"x-prediction-based-scheduling": "false"}
        async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as resp:
            assert resp.headers["x-slorouter-route"] == "heuristic"
        metrics = router.metrics.render().decode()
        assert "slorouter_predictor_ready 1.0" in metrics
        assert 'slorouter_predictor_model_info{model="ttft"' in metrics
        assert "inference_objective_request_predicted_ttft_seconds_count{" in metrics
        assert 'slorouter_prediction_fallbacks_total{reason="warming-up"}' in metrics
        assert router.predictor.store.count("tpot") == 0  # streamingMode false trains on E2E only
    finally:
        await router.stop()


async def test_bad_slo_headers_and_unknown_objectives_are_400(cluster, router, http):
    body = {"model": cluster.model, "prompt": "x", "max_tokens": 1}
    for headers, needle in (
        ({"x-slo-ttft-ms": "soon"}, "x-slo-ttft-ms"),
        ({"x-slo-tpot-ms": "-3"}, "x-slo-tpot-ms"),
        ({"x-gateway-inference-objective": "nope"}, "unknown inference objective"),
    ):
        async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as resp:
            assert resp.status == 400
            assert needle in (await resp.json())["error"]["message"]


async def test_impossible_slo_sheds_sheddable_requests_only(cluster, http):
    router = await start_router(
        list(cluster.addresses),
        predictor=_predictor(),
        objectives={"batch": {"priority": -1}, "critical": {"priority": 5}},
    )
    long_prompt = "lorem ipsum dolor sit amet " * 1000
    direct = []
    try:
        await _warm_up(http, router, cluster.model)
        # Keep every pod busy (running requests, KV cache past the 2% "cold" mark).
        for address in cluster.addresses:
            for i in range(2):
                body = {"model": cluster.model, "prompt": f"{address} {i} {long_prompt}", "max_tokens": 4000}
                direct.append(asyncio.create_task(http.post(f"http://{address}/v1/completions", json=body)))
        await eventually(
            lambda: all(router.pool.value(a, "kv_usage") > 0.02 and router.pool.value(a, "running") > 0
                        for a in cluster.addresses),
            timeout=30,
        )  # fmt: skip
        body = {"model": cluster.model, "prompt": "urgent?", "max_tokens": 2}
        impossible = {"x-slo-ttft-ms": "0.001", "x-gateway-inference-objective": "batch"}
        url = f"http://{router.address}/v1/completions"
        async with http.post(url, json=body, headers=impossible) as resp:
            assert resp.status == 429
            assert resp.headers["x-slorouter-dropped-reason"] == "slo-unattainable"
            assert resp.headers["Retry-After"]
            assert "x-slorouter-endpoint" not in resp.headers
            assert (await resp.json())["error"]["type"] == "RateLimitError"
        critical = {**impossible, "x-gateway-inference-objective": "critical"}
        async with http.post(url, json=body, headers=critical) as resp:
            assert resp.status == 200  # not sheddable: served, and the violation is counted
        metrics = router.metrics.render().decode()
        assert f'slorouter_requests_shed_total{{model_name="{cluster.model}"' in metrics
        await eventually(lambda: "inference_objective_request_ttft_slo_violation_total{" in
                         router.metrics.render().decode())  # fmt: skip
    finally:
        for task in direct:
            task.cancel()
        await asyncio.gather(*direct, return_exceptions=True)
        await router.stop()


@pytest.mark.parametrize("streaming_mode", [True])
async def test_streaming_mode_trains_ttft_and_tpot(cluster, http, streaming_mode):
    scheduler = copy.deepcopy(PREDICTED_LATENCY_SCHEDULER_CONFIG)
    for plugin in scheduler["plugins"]:
        if plugin["type"] == "predicted-latency-producer":
            plugin["parameters"] = {"streamingMode": streaming_mode}
    router = await start_router(list(cluster.addresses), predictor=_predictor(), scheduler=scheduler)
    try:
        await _warm_up(http, router, cluster.model, stream=True)
        await eventually(lambda: router.predictor.store.count("tpot") >= 30)
        assert router.predictor.store.count("ttft") >= 30
        body = {"model": cluster.model, "prompt": "a streamed answer", "max_tokens": 4, "stream": True}
        headers = {"x-slo-ttft-ms": "5000", "x-slo-tpot-ms": "1000"}
        async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
            await resp.read()
            assert float(resp.headers["x-slorouter-predicted-ttft-ms"]) > 0
        # The gateway's own record of how the served predictions held (TTFT and TPOT of that request)
        for model in ("ttft", "tpot"):
            await eventually(
                lambda model=model: (
                    f'slorouter_prediction_actual_over_predicted_count{{model="{model}"}}'
                    in router.metrics.render().decode()
                )
            )
    finally:
        await router.stop()


async def test_the_ledger_pairs_predictions_with_outcomes_on_the_status_page_and_metrics(cluster, http):
    router = await start_router(
        list(cluster.addresses), predictor=_predictor(), objectives={"chat": {"priority": 1}}
    )
    try:
        await _warm_up(http, router, cluster.model)
        headers = {"x-gateway-inference-objective": "chat"}
        for i in range(12):
            body = {
                "model": cluster.model,
                "prompt": f"ledger {i} " + "words " * (10 * (i % 4)),
                "max_tokens": 3,
            }
            async with http.post(f"http://{router.address}/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200 and r.headers["x-slorouter-route"] in ("predicted", "explore")
                await r.read()
        async with http.get(f"http://{router.address}{STATUS_PATH}") as resp:
            status = decode_status(await resp.read())
        ledger = status.ledger
        assert ledger is not None and ledger.quantile == 0.9
        chat = ledger.objectives["chat"]["ttft"]
        assert chat.outcomes == 12 and 0.0 <= chat.coverage <= 1.0
        assert chat.mape is not None and chat.bias is not None  # the embedded predictor's point predictions
        assert set(ledger.endpoints) <= set(cluster.addresses)
        assert sum(k["ttft"].outcomes for k in ledger.endpoints.values()) >= 12
        metrics = router.metrics.render().decode()
        assert 'slorouter_prediction_ledger_objective_coverage{kind="ttft",objective="chat"}' in metrics
        assert "slorouter_prediction_drifts_total 0.0" in metrics
    finally:
        await router.stop()


async def test_a_drift_past_fallback_after_s_routes_by_the_heuristic_profile(cluster, http):
    # A band no model meets: the endpoints drift as soon as they have outcomes, and are distrusted at once.
    ledger = {"coverage_band": [0.0, 0.01], "drift_after_s": 0.2, "fallback_after_s": 0, "min_outcomes": 5}
    router = await start_router(list(cluster.addresses), predictor={**_predictor(), "ledger": ledger})
    try:
        await _warm_up(http, router, cluster.model)

        async def routes(n: int) -> list[tuple[str, str | None]]:
            got = []
            for i in range(n):
                body = {"model": cluster.model, "prompt": f"drift {i} " + "words " * (i % 9), "max_tokens": 2}
                async with http.post(f"http://{router.address}/v1/completions", json=body) as r:
                    assert r.status == 200
                    await r.read()
                    got.append((r.headers["x-slorouter-route"], r.headers.get("x-slorouter-fallback-reason")))
                    if got[-1][0] == "fallback":  # distrusted predictions are not served
                        assert "x-slorouter-predicted-ttft-ms" not in r.headers
            return got

        async def distrusted() -> bool:
            await routes(4)
            return bool(router.core.ledger.distrusted)

        await eventually(distrusted, timeout=30)
        after = await routes(6)
        assert after == [("fallback", "drift")] * 6
        async with http.get(f"http://{router.address}{STATUS_PATH}") as resp:
            status = decode_status(await resp.read())
        assert status.ledger is not None and set(status.ledger.distrusted) <= set(cluster.addresses)
        assert status.ledger.distrusted and status.ledger.drifting
        metrics = router.metrics.render().decode()
        assert 'slorouter_prediction_fallbacks_total{reason="drift"}' in metrics
        assert "slorouter_prediction_distrusted{endpoint=" in metrics
    finally:
        await router.stop()


async def test_the_ledger_can_be_turned_off(cluster, http):
    router = await start_router(
        list(cluster.addresses), predictor={**_predictor(), "ledger": {"enabled": False}}
    )
    try:
        await _warm_up(http, router, cluster.model)
        async with http.get(f"http://{router.address}{STATUS_PATH}") as resp:
            assert decode_status(await resp.read()).ledger is None
        assert "slorouter_prediction_ledger" not in router.metrics.render().decode()
    finally:
        await router.stop()
