"""predicted-latency-producer: features, predictions and headroom before the pick; samples after."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from slorouter.clock import ManualClock
from slorouter.director import Director
from slorouter.metrics import LatencyMetrics
from slorouter.pool.inflight import InFlightTracker
from slorouter.predictor.backend import PredictionUnavailable
from slorouter.predictor.features import ALL_FEATURES, TPOT_FEATURES, TTFT_FEATURES
from slorouter.scheduling.datakeys import PREDICTED_TTFT_MS, TTFT_HEADROOM_MS
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext, Termination
from slorouter.scheduling.types import InferenceRequest
from slorouter.serving.headers import RoutingFacts
from tests.helpers.scheduling import addresses, candidates_of, make_pool, produced


class FakeBackend:
    """A predictor whose TTFT prediction is 100 ms × (1 + waiting) and TPOT 10 ms."""

    def __init__(self, ready: bool = True, sync: bool = True) -> None:
        self.ready = ready
        self.synchronous = sync
        self.samples: list[tuple[str, np.ndarray, float]] = []
        self.rows: list[np.ndarray] = []
        self.calls = 0

    def predict_now(self, x_all):
        if not self.synchronous:
            raise PredictionUnavailable("remote")
        return self._predict(x_all)

    def _predict(self, x_all):
        self.calls += 1
        self.rows.append(x_all)
        if not self.ready:
            raise PredictionUnavailable("down")
        waiting = x_all[:, ALL_FEATURES.index("num_request_waiting")]
        return 100.0 * (1 + waiting), np.full(len(x_all), 10.0)

    async def predict(self, x_all):
        await asyncio.sleep(0)
        return self._predict(x_all)

    def add_sample(self, kind, row, latency_ms):
        self.samples.append((kind, np.array(row), latency_ms))


def _director(backend, streaming=False, extra=None):
    clock = ManualClock(10.0)
    pool = make_pool(3, waiting=[2, 0, 1], kv_usage=[0.3, 0.1, 0.2], running=[4, 1, 2])
    registry = CollectorRegistry()
    ctx = PluginContext(clock=clock, rng=np.random.default_rng(0), pool=pool, predictor=backend,
                        metrics=LatencyMetrics(registry))  # fmt: skip
    config = {
        "plugins": [
            {
                "type": "predicted-latency-producer",
                "parameters": {"streamingMode": streaming, **(extra or {})},
            },
            {"type": "latency-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": "latency-scorer"}, {"pluginRef": "max-score-picker"}],
            }
        ],
    }
    setup = build_scheduler_setup(config, ctx)
    return Director(pool, setup, InFlightTracker(pool), clock), registry


def _request(**fields):
    return InferenceRequest("r1", "m", "hello " * 40, prompt_tokens=60, max_tokens=8, **fields)


def test_predictions_route_to_the_fastest_pod_and_e2e_trains_the_ttft_model():
    backend = FakeBackend()
    director, registry = _director(backend)
    request = _request()
    result = director.schedule(request)
    assert result.target.address == addresses(3)[1]  # waiting 0 → predicted 100 ms, the lowest
    assert result.primary.route == "predicted"
    lifecycle = director.dispatch(request, result)
    director.clock.advance(0.25)
    lifecycle.on_headers(200, streaming=False)
    lifecycle.end()
    assert len(backend.samples) == 1
    kind, row, latency = backend.samples[0]
    assert kind == "ttft" and latency == pytest.approx(250.0)
    features = dict(zip(TTFT_FEATURES, row.tolist(), strict=True))
    assert features["num_request_waiting"] == 0 and features["input_token_length"] == 60
    assert features["kv_cache_percentage"] == pytest.approx(0.1)
    assert registry.get_sample_value("slorouter_training_samples_total", {"model": "ttft"}) == 1


def test_streaming_mode_trains_ttft_at_the_first_token_and_tpot_from_token_counts():
    backend = FakeBackend()
    director, _ = _director(backend, streaming=True)
    request = _request(slo_ttft_ms=500.0, slo_tpot_ms=50.0)
    lifecycle = director.dispatch(request, director.schedule(request))
    director.clock.advance(0.1)
    lifecycle.on_headers(200, streaming=True)
    lifecycle.on_tokens(1)
    director.clock.advance(0.07)
    lifecycle.on_tokens(7)
    lifecycle.end(usage={"completion_tokens": 8})
    kinds = [(k, round(v, 3)) for k, _, v in backend.samples]
    assert kinds == [("ttft", 100.0), ("tpot", 10.0)]  # (170 − 100) / (8 − 1)
    tpot_row = dict(zip(TPOT_FEATURES, backend.samples[1][1].tolist(), strict=True))
    assert tpot_row["num_tokens_generated"] == 8


def test_actual_over_served_prediction_is_recorded_per_model():
    """Predicted 100 ms TTFT and 10 ms TPOT on the chosen pod; actual 75 ms and (170 − 75) / 7 ms."""
    backend = FakeBackend()
    director, registry = _director(backend, streaming=True, extra={"endpointCorrection": False})
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    director.clock.advance(0.075)
    lifecycle.on_headers(200, streaming=True)
    lifecycle.on_tokens(1)
    director.clock.advance(0.095)
    lifecycle.end(usage={"completion_tokens": 8})

    def share_at_most(model: str, bound: str) -> float | None:
        name = "slorouter_prediction_actual_over_predicted_bucket"
        return registry.get_sample_value(name, {"model": model, "le": bound})

    assert share_at_most("ttft", "0.8") == 1 and share_at_most("ttft", "0.67") == 0
    assert share_at_most("tpot", "1.0") == 0 and share_at_most("tpot", "1.5") == 1  # 13.6 / 10
    total = registry.get_sample_value("slorouter_prediction_actual_over_predicted_sum", {"model": "tpot"})
    assert total == pytest.approx(95 / 7 / 10)


def test_the_backend_gets_one_union_row_per_candidate_and_samples_are_its_model_columns():
    backend = FakeBackend()
    director, _ = _director(backend, streaming=True)
    request = _request(slo_ttft_ms=500.0, slo_tpot_ms=50.0)
    result = director.schedule(request)
    lifecycle = director.dispatch(request, result)
    director.clock.advance(0.1)
    lifecycle.on_headers(200, streaming=True)
    lifecycle.on_tokens(1)
    director.clock.advance(0.07)
    lifecycle.end(usage={"completion_tokens": 8})
    (x_all,) = backend.rows
    assert x_all.shape == (3, len(ALL_FEATURES))
    target = addresses(3).index(result.target.address)
    (_, ttft_row, _), (_, tpot_row, _) = backend.samples
    np.testing.assert_array_equal(ttft_row, x_all[target, : len(TTFT_FEATURES)])
    np.testing.assert_array_equal(tpot_row, x_all[target, [ALL_FEATURES.index(n) for n in TPOT_FEATURES]])


def test_a_request_served_by_another_candidate_trains_on_that_candidates_row():
    backend = FakeBackend()
    director, _ = _director(backend, streaming=True)
    request = _request(slo_ttft_ms=500.0, slo_tpot_ms=50.0)
    result = director.schedule(request)
    lifecycle = director.dispatch(request, result)
    picked = result.target.address
    served = next(a for a in addresses(3) if a != picked)
    assert lifecycle.served_by(served)
    assert not lifecycle.served_by(served)  # already there
    assert not lifecycle.served_by("10.9.9.9:1")  # not an endpoint of the pool
    inflight = director.pool.columns["inflight_requests"]
    assert inflight[director.pool.position(picked)] == 0 and inflight[director.pool.position(served)] == 1
    director.clock.advance(0.1)
    lifecycle.on_headers(200, streaming=True)
    lifecycle.on_tokens(1)
    director.clock.advance(0.07)
    lifecycle.end(usage={"completion_tokens": 8})
    assert inflight.sum() == 0
    (x_all,) = backend.rows
    (_, ttft_row, _), (_, tpot_row, _) = backend.samples
    row = addresses(3).index(served)
    np.testing.assert_array_equal(ttft_row, x_all[row, : len(TTFT_FEATURES)])
    np.testing.assert_array_equal(tpot_row, x_all[row, [ALL_FEATURES.index(n) for n in TPOT_FEATURES]])


@pytest.mark.parametrize("streaming", [False, True])
def test_a_request_cancelled_before_its_first_token_trains_on_its_wait_when_above_the_prediction(streaming):
    """The pick's prediction is 100 ms; a cancel at 250 ms is a lower bound that corrects it, one at 50 ms
    says nothing and is dropped."""
    for waited_s, samples in ((0.25, [("ttft", 250.0)]), (0.05, [])):
        backend = FakeBackend()
        director, _ = _director(backend, streaming=streaming)
        request = _request()
        lifecycle = director.dispatch(request, director.schedule(request))
        director.clock.advance(waited_s)
        lifecycle.end(Termination.CANCELLED, detail="deadline: ttft")
        assert [(k, round(v, 3)) for k, _, v in backend.samples] == samples


def test_a_stream_cut_for_its_tpot_trains_the_tpot_it_had():
    backend = FakeBackend()
    director, _ = _director(backend, streaming=True)
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    director.clock.advance(0.1)
    lifecycle.on_headers(200, streaming=True)
    lifecycle.on_tokens(1)
    director.clock.advance(0.2)
    lifecycle.on_tokens(4)
    lifecycle.end(Termination.CANCELLED, detail="deadline: tpot")
    assert [(k, round(v, 3)) for k, _, v in backend.samples] == [("ttft", 100.0), ("tpot", 50.0)]


def test_failed_requests_produce_no_samples():
    backend = FakeBackend()
    director, _ = _director(backend)
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    lifecycle.on_headers(500, False)
    lifecycle.end()
    assert backend.samples == []


@pytest.mark.parametrize(("backend", "reason"), [(FakeBackend(ready=False), "warming-up"), (None, None)])
def test_without_a_ready_predictor_the_scorer_falls_back(backend, reason):
    director, registry = _director(backend)
    result = director.schedule(_request())
    assert result.primary.route == "fallback"
    if reason:
        assert registry.get_sample_value("slorouter_prediction_fallbacks_total", {"reason": reason}) == 1


def test_prediction_unavailable_falls_back_and_still_trains():
    backend = FakeBackend()
    director, registry = _director(backend)
    backend.predict_now = lambda _: (_ for _ in ()).throw(PredictionUnavailable("timeout"))
    request = _request()
    result = director.schedule(request)
    assert result.primary.route == "fallback"
    assert registry.get_sample_value("slorouter_prediction_fallbacks_total", {"reason": "unavailable"}) == 1
    lifecycle = director.dispatch(request, result)
    director.clock.advance(0.2)
    lifecycle.end()
    assert [k for k, _, _ in backend.samples] == ["ttft"]


@pytest.mark.parametrize("reason", ["breaker-open", "timeout", "unavailable"])
def test_the_fallback_reason_is_the_backends_and_reaches_the_response_headers(reason):
    backend = FakeBackend()
    director, registry = _director(backend)
    backend.predict_now = lambda _: (_ for _ in ()).throw(PredictionUnavailable("no", reason))
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    assert lifecycle.route == "fallback" and lifecycle.fallback_reason == reason
    headers = dict(RoutingFacts.of(lifecycle).headers())
    assert headers["x-slorouter-route"] == "fallback"
    assert headers["x-slorouter-fallback-reason"] == reason
    # The metric keeps the coarse reason: one series per backend failure kind would say the same thing.
    assert registry.get_sample_value("slorouter_prediction_fallbacks_total", {"reason": "unavailable"}) == 1
    lifecycle.end()


async def test_a_remote_prediction_cut_by_the_producers_budget_is_a_timeout_fallback():
    """A remote predictor slower than dataProducerTimeoutMs: the director cancels the producer; the request
    must still be marked as a fallback (before, it went by the prediction profile with no prediction and
    the response said route heuristic, no reason)."""
    backend = FakeBackend(sync=False)
    director, registry = _director(backend)

    async def hang(_):
        await asyncio.get_running_loop().create_future()

    backend.predict = hang
    director.setup.data_producer_timeout_s = 0.02
    request = _request()
    result = await director.schedule_async(request)
    assert result.primary.route == "fallback"
    assert request.prediction_unavailable == "timeout"
    assert registry.get_sample_value("slorouter_prediction_fallbacks_total", {"reason": "unavailable"}) == 1


def test_predicted_requests_carry_no_fallback_reason():
    director, _ = _director(FakeBackend())
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    assert lifecycle.route != "fallback" and lifecycle.fallback_reason is None
    assert "x-slorouter-fallback-reason" not in dict(RoutingFacts.of(lifecycle).headers())
    lifecycle.end()


def test_opted_out_requests_are_not_predicted_but_train():
    backend = FakeBackend()
    director, _ = _director(backend)
    request = _request(use_prediction=False)
    result = director.schedule(request)
    assert backend.calls == 0 and result.primary.route == "fallback"


async def test_remote_backends_are_awaited():
    backend = FakeBackend(sync=False)
    director, _ = _director(backend)
    result = await director.schedule_async(_request())
    assert result.target.address == addresses(3)[1]
    with pytest.raises(RuntimeError, match="schedule_async"):
        director.schedule(_request())


def test_headroom_attached_for_slo_requests():
    backend = FakeBackend()
    director, _ = _director(backend)
    cands = produced(director, _request(slo_ttft_ms=250.0))
    assert cands.attrs[PREDICTED_TTFT_MS].tolist() == [300.0, 100.0, 200.0]
    assert cands.attrs[TTFT_HEADROOM_MS].tolist() == [-50.0, 150.0, 50.0]


def test_endpoint_correction_learns_a_slow_pod():
    backend = FakeBackend()
    director, _ = _director(backend)
    producer = director.setup.plugins["predicted-latency-producer"]
    slow = addresses(3)[1]
    for _ in range(40):
        producer.correction.observe(slow, "ttft", 100.0, 400.0)
    request = _request()
    result = director.schedule(request)
    assert result.target.address != slow  # its 100 ms prediction now reads ~400 ms


def test_an_outage_after_warm_up_is_counted_as_unavailable():
    backend = FakeBackend()
    director, registry = _director(backend)
    director.schedule(_request())
    backend.ready = False
    director.schedule(_request())
    director.schedule(_request())
    assert registry.get_sample_value("slorouter_prediction_fallbacks_total", {"reason": "unavailable"}) == 2
    assert registry.get_sample_value("slorouter_prediction_fallbacks_total", {"reason": "warming-up"}) is None


def _stream(director, request, ttft_s: float, rest_s: float, tokens: int = 8):
    result = director.schedule(request)
    lifecycle = director.dispatch(request, result)
    director.clock.advance(ttft_s)
    lifecycle.on_headers(200, streaming=True)
    lifecycle.on_tokens(1)
    director.clock.advance(rest_s)
    lifecycle.end(usage={"completion_tokens": tokens})
    return lifecycle


def test_live_coverage_raises_predictions_that_are_missed():
    """TPOT served at 10 ms, actual 20 ms: every outcome is a miss, so the served TPOT grows by
    exp(0.01 × 0.9) per outcome; TTFT (100 ms served, 50 ms actual) is covered, so it shrinks."""
    backend = FakeBackend()
    director, registry = _director(backend, streaming=True, extra={"endpointCorrection": False})
    producer = director.setup.plugins["predicted-latency-producer"]
    for _ in range(5):
        _stream(director, _request(), ttft_s=0.05, rest_s=0.14)  # TPOT (190 − 50) / 7 = 20 ms
    assert producer.coverage.factor("tpot") == pytest.approx(math.exp(5 * 0.009))
    assert producer.coverage.factor("ttft") == pytest.approx(math.exp(-5 * 0.001))
    gauge = registry.get_sample_value("slorouter_prediction_coverage_factor", {"model": "tpot"})
    assert gauge == pytest.approx(math.exp(5 * 0.009))
    lifecycle = _stream(director, _request(), ttft_s=0.05, rest_s=0.14)
    prediction = lifecycle.prediction
    assert prediction is not None and prediction.tpot_ms is not None
    assert prediction.tpot_ms == pytest.approx(10.0 * math.exp(5 * 0.009))
    assert prediction.tpot_coverage_factor == pytest.approx(math.exp(5 * 0.009))
    assert prediction.ttft_ms == pytest.approx(100.0 * math.exp(-5 * 0.001))  # the least-waiting pod's
    assert prediction.ttft_ms / prediction.ttft_coverage_factor == pytest.approx(100.0)


def test_live_coverage_can_be_turned_off():
    backend = FakeBackend()
    director, registry = _director(backend, streaming=True, extra={"coverageStep": 0})
    assert director.setup.plugins["predicted-latency-producer"].coverage is None
    for _ in range(3):
        lifecycle = _stream(director, _request(), ttft_s=0.05, rest_s=0.14)
    assert lifecycle.prediction is not None and lifecycle.prediction.tpot_ms == pytest.approx(10.0)
    assert registry.get_sample_value("slorouter_prediction_coverage_factor", {"model": "tpot"}) is None


@pytest.mark.parametrize("extra", [{"coverageStep": -0.1}, {"coverageStep": 1.0}, {"coverageQuantile": 1.0}])
def test_invalid_coverage_settings_are_configuration_errors(extra):
    with pytest.raises(ValueError, match="coverage"):
        _director(FakeBackend(), streaming=True, extra=extra)


def test_routing_reads_the_models_quantile_and_clients_get_the_covered_one():
    """The live-coverage factor is in what is served (headers, metrics) and not in what the tiers, the
    admitter and the scorers compare: with it, the TTFT tiers were stricter and lost SLO attainment."""
    backend = FakeBackend()
    director, _ = _director(backend, streaming=True, extra={"endpointCorrection": False})
    for _ in range(20):
        _stream(director, _request(), ttft_s=0.5, rest_s=0.14)  # TTFT 500 ms against 100 served: missed
    factor = director.setup.plugins["predicted-latency-producer"].coverage.factor("ttft")
    assert factor == pytest.approx(math.exp(20 * 0.009))
    producer = director.setup.plugins["predicted-latency-producer"]
    request = _request(slo_ttft_ms=110.0)
    cands = candidates_of(director.pool)
    producer.produce(request, cands)
    assert cands.attrs[PREDICTED_TTFT_MS].tolist() == [300.0, 100.0, 200.0]  # the models' p90, unscaled
    assert cands.attrs[TTFT_HEADROOM_MS][1] == pytest.approx(10.0)  # meets 110 ms by its raw p90
    lifecycle = director.dispatch(request, director.schedule(request))
    assert lifecycle.prediction is not None
    assert lifecycle.prediction.ttft_ms == pytest.approx(100.0 * factor)  # what the client is told
