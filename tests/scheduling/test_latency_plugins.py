"""Rules of the plugins that consume latency predictions: affinity gate, tiers, headroom scoring, shedding."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from slorouter.scheduling.datakeys import (
    PREDICTED_TPOT_MS,
    PREDICTED_TTFT_MS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_TOTAL_BLOCKS,
    TPOT_HEADROOM_MS,
    TPOT_VALID,
    TTFT_HEADROOM_MS,
    TTFT_VALID,
)
from slorouter.scheduling.plugins.latency import (
    LatencyBandFilter,
    LatencyScorer,
    LatencySloAdmitter,
    PrefixCacheAffinityFilter,
    SloHeadroomTierFilter,
    headroom_bucket_scores,
)
from slorouter.scheduling.plugins.latency_producer import compute_headroom
from slorouter.scheduling.types import AdmissionDeniedError, CycleState, PickReason, Route
from tests.helpers.scheduling import addresses, candidates_of, make_ctx, make_pool, make_request


def _plugin(cls, seed=0, **params):
    return cls(cls.type_name, cls.Params.model_validate(params), make_ctx(seed))


def _with_prefix(cands, matched, total=10):
    cands.attrs[PREFIX_MATCH_BLOCKS] = np.array(matched, dtype=np.int64)
    cands.attrs[PREFIX_TOTAL_BLOCKS] = np.full(len(matched), total, dtype=np.int64)
    return cands


def _with_predictions(cands, predicted_ttft, predicted_tpot=None, **slo):
    ttft = np.asarray(predicted_ttft, dtype=float)
    tpot = np.zeros(len(ttft)) if predicted_tpot is None else np.asarray(predicted_tpot, dtype=float)
    cands.attrs[PREDICTED_TTFT_MS] = ttft
    cands.attrs[PREDICTED_TPOT_MS] = tpot
    cands.attrs.update(
        compute_headroom(
            ttft,
            tpot,
            slo_ttft_ms=slo.get("ttft"),
            slo_tpot_ms=slo.get("tpot"),
            streaming_mode=slo.get("streaming", False),
        )
    )
    return cands


def _kept(cands):
    return [e.address for e in cands.endpoints]


# --- compute_headroom --------------------------------------------------------------------------------
def test_headroom_with_both_slos_in_streaming_mode():
    out = compute_headroom(
        np.array([100.0, 300.0]), np.array([20.0, 60.0]), slo_ttft_ms=200, slo_tpot_ms=50, streaming_mode=True
    )
    assert out[TTFT_HEADROOM_MS].tolist() == [100.0, -100.0]
    assert out[TPOT_HEADROOM_MS].tolist() == [30.0, -10.0]
    assert out[TTFT_VALID].tolist() == [True, False]
    assert out[TPOT_VALID].tolist() == [True, False]


def test_a_missing_slo_dimension_is_unconstrained():
    # The original's trap: only x-slo-ttft-ms in streaming mode made every pod TPOT-invalid.
    out = compute_headroom(
        np.array([100.0]), np.array([500.0]), slo_ttft_ms=200, slo_tpot_ms=None, streaming_mode=True
    )
    assert out[TPOT_VALID].tolist() == [True] and out[TPOT_HEADROOM_MS].tolist() == [0.0]
    out = compute_headroom(
        np.array([900.0]), np.array([10.0]), slo_ttft_ms=None, slo_tpot_ms=50, streaming_mode=True
    )
    assert out[TTFT_VALID].tolist() == [True] and out[TTFT_HEADROOM_MS].tolist() == [0.0]
    assert out[TPOT_HEADROOM_MS].tolist() == [40.0]


def test_no_slo_makes_every_pod_miss_by_its_prediction():
    out = compute_headroom(np.array([100.0, 50.0]), np.array([9.0, 7.0]), slo_ttft_ms=None, slo_tpot_ms=None,
                           streaming_mode=False)  # fmt: skip
    assert out[TTFT_HEADROOM_MS].tolist() == [-100.0, -50.0]
    assert not out[TTFT_VALID].any()
    assert out[TPOT_HEADROOM_MS].tolist() == [0.0, 0.0]  # TPOT is not modelled outside streaming mode
    streaming = compute_headroom(np.array([100.0]), np.array([9.0]), slo_ttft_ms=None, slo_tpot_ms=None,
                                 streaming_mode=True)  # fmt: skip
    assert streaming[TPOT_HEADROOM_MS].tolist() == [-9.0]


def test_ttft_buffer_factor_asks_for_a_margin_below_the_slo():
    out = compute_headroom(
        np.array([70.0, 90.0]), np.array([0.0, 0.0]), slo_ttft_ms=100, slo_tpot_ms=None,
        streaming_mode=False, ttft_slo_buffer_factor=0.8,
    )  # fmt: skip
    assert out[TTFT_HEADROOM_MS].tolist() == [10.0, -10.0]
    assert out[TTFT_VALID].tolist() == [True, False]


def test_tpot_budget_protects_the_strictest_running_request():
    out = compute_headroom(
        np.array([10.0, 10.0]), np.array([30.0, 30.0]), slo_ttft_ms=None, slo_tpot_ms=50,
        streaming_mode=True, slo_buffer_factor=1.0, strictest_running_tpot_slo_ms=np.array([25.0, 0.0]),
    )  # fmt: skip
    assert out[TPOT_HEADROOM_MS].tolist() == [-5.0, 20.0]
    assert out[TPOT_VALID].tolist() == [False, True]


# --- prefix-cache-affinity-filter -------------------------------------------------------------------
def test_affinity_keeps_warm_pods_above_the_threshold():
    f = _plugin(PrefixCacheAffinityFilter, explorationProbability=0)
    cands = _with_prefix(candidates_of(make_pool(3)), [9, 7, 8])
    assert _kept(f.filter(CycleState(), make_request(), cands)) == [addresses(3)[0], addresses(3)[2]]


def test_affinity_without_warm_pods_or_disabled_keeps_all():
    f = _plugin(PrefixCacheAffinityFilter, explorationProbability=0)
    cands = _with_prefix(candidates_of(make_pool(3)), [1, 2, 3])
    assert len(f.filter(CycleState(), make_request(), cands)) == 3
    off = _plugin(PrefixCacheAffinityFilter, explorationProbability=0, affinityThreshold=0)
    cands = _with_prefix(candidates_of(make_pool(3)), [10, 0, 0])
    assert len(off.filter(CycleState(), make_request(), cands)) == 3


def test_affinity_ttft_gate_drops_stickiness_when_warm_pods_are_too_slow():
    f = _plugin(PrefixCacheAffinityFilter, explorationProbability=0, maxTTFTPenaltyMs=5000)
    slow = _with_predictions(_with_prefix(candidates_of(make_pool(2)), [10, 0]), [7000.0, 1000.0])
    assert len(f.filter(CycleState(), make_request(), slow)) == 2  # 6000 ms worse > 5000 ms penalty
    fine = _with_predictions(_with_prefix(candidates_of(make_pool(2)), [10, 0]), [5900.0, 1000.0])
    assert len(f.filter(CycleState(), make_request(), fine)) == 1
    never = _plugin(PrefixCacheAffinityFilter, explorationProbability=0, maxTTFTPenaltyMs=0)
    slow = _with_predictions(_with_prefix(candidates_of(make_pool(2)), [10, 0]), [70000.0, 1.0])
    assert len(never.filter(CycleState(), make_request(), slow)) == 1


def test_affinity_exploration_rate_is_seeded_and_marks_the_cycle():
    f = _plugin(PrefixCacheAffinityFilter, seed=3, explorationProbability=0.2)
    explored = 0
    for _ in range(2000):
        cycle = CycleState()
        kept = f.filter(cycle, make_request(), _with_prefix(candidates_of(make_pool(3)), [10, 0, 0]))
        if len(kept) == 3:
            explored += 1
            assert cycle.explored
    assert 0.17 < explored / 2000 < 0.23


@pytest.mark.parametrize("bad", [{"affinityThreshold": 1.5}, {"explorationProbability": -0.1},
                                 {"maxTTFTPenaltyMs": -1}, {"bogus": 1}])  # fmt: skip
def test_affinity_parameter_validation(bad):
    with pytest.raises(ValueError):
        PrefixCacheAffinityFilter.Params.model_validate(bad)


# --- slo-headroom-tier-filter -----------------------------------------------------------------------
def test_tier_filter_keeps_the_positive_tier():
    f = _plugin(SloHeadroomTierFilter, epsilonExploreNeg=0)
    cands = _with_predictions(candidates_of(make_pool(3)), [100.0, 300.0, 150.0], ttft=200)
    cycle = CycleState()
    assert _kept(f.filter(cycle, make_request(), cands)) == [addresses(3)[0], addresses(3)[2]]
    assert cycle.reason is PickReason.SLO_TIER


def test_tier_filter_dimensions():
    cands = _with_predictions(
        candidates_of(make_pool(3)),
        [100.0, 300.0, 150.0],
        [10.0, 10.0, 40.0],
        ttft=200,
        tpot=20,
        streaming=True,
    )
    both = _plugin(SloHeadroomTierFilter, epsilonExploreNeg=0)
    assert _kept(both.filter(CycleState(), make_request(), cands)) == [addresses(3)[0]]
    ttft_only = _plugin(SloHeadroomTierFilter, epsilonExploreNeg=0, dimensions=["ttft"])
    assert _kept(ttft_only.filter(CycleState(), make_request(), cands)) == [addresses(3)[0], addresses(3)[2]]
    tpot_only = _plugin(SloHeadroomTierFilter, epsilonExploreNeg=0, dimensions=["tpot"])
    assert _kept(tpot_only.filter(CycleState(), make_request(), cands)) == addresses(3)[:2]


@pytest.mark.parametrize("dimensions", [[], ["ttft", "ttft"], ["e2e"], "ttft"])
def test_tier_filter_parameter_validation(dimensions):
    with pytest.raises(ValueError, match="dimensions"):
        SloHeadroomTierFilter.Params.model_validate({"dimensions": dimensions})


def test_tier_filter_passes_through_with_one_tier_or_no_predictions():
    f = _plugin(SloHeadroomTierFilter, epsilonExploreNeg=0)
    all_miss = _with_predictions(candidates_of(make_pool(3)), [300.0, 400.0, 500.0], ttft=200)
    assert len(f.filter(CycleState(), make_request(), all_miss)) == 3
    no_slo = _with_predictions(candidates_of(make_pool(3)), [1.0, 2.0, 3.0])
    assert len(f.filter(CycleState(), make_request(), no_slo)) == 3
    assert len(f.filter(CycleState(), make_request(), candidates_of(make_pool(3)))) == 3


def test_tier_filter_explores_the_negative_tier_at_its_rate():
    f = _plugin(SloHeadroomTierFilter, seed=5, epsilonExploreNeg=0.1)
    negative = 0
    for _ in range(3000):
        cands = _with_predictions(candidates_of(make_pool(2)), [100.0, 300.0], ttft=200)
        if _kept(f.filter(CycleState(), make_request(), cands)) == [addresses(2)[1]]:
            negative += 1
    assert 0.08 < negative / 3000 < 0.12


# --- latency-band-filter ---------------------------------------------------------------------------
def test_band_filter_keeps_the_candidates_within_the_band_of_the_best():
    f = _plugin(LatencyBandFilter, relativeBand=0.25, absoluteBandMs=10)
    cands = _with_predictions(candidates_of(make_pool(4)), [100.0, 134.0, 136.0, 400.0])
    cycle = CycleState()
    assert _kept(f.filter(cycle, make_request(), cands)) == addresses(4)[:2]  # ≤ 100 · 1.25 + 10
    assert cycle.route is Route.PREDICTED and cycle.reason is PickReason.LATENCY_BAND
    everyone = CycleState()
    f.filter(everyone, make_request(), _with_predictions(candidates_of(make_pool(2)), [100.0, 101.0]))
    assert everyone.reason is None  # kept every candidate: no reason of its own


def test_band_filter_without_predictions_keeps_all_and_marks_the_fallback():
    f = _plugin(LatencyBandFilter)
    cycle = CycleState()
    assert len(f.filter(cycle, make_request(), candidates_of(make_pool(3)))) == 3
    assert cycle.route is Route.FALLBACK


def test_band_filter_with_zero_band_keeps_the_ties_of_the_best():
    f = _plugin(LatencyBandFilter, relativeBand=0, absoluteBandMs=0)
    cands = _with_predictions(candidates_of(make_pool(3)), [50.0, 50.0, 50.1])
    assert _kept(f.filter(CycleState(), make_request(), cands)) == addresses(3)[:2]


# --- latency-scorer --------------------------------------------------------------------------------
def test_bucket_scores_least_and_most():
    ttft = np.array([10.0, 50.0, 100.0])
    least = headroom_bucket_scores(ttft, np.zeros(3), ttft_weight=0.8, tpot_weight=0.2, strategy="least")
    most = headroom_bucket_scores(ttft, np.zeros(3), ttft_weight=0.8, tpot_weight=0.2, strategy="most")
    # TPOT does not vary, so TTFT takes all the weight: n = [0, 0.444, 1].
    assert least.tolist() == pytest.approx([1.01, 0.56, 0.01])
    assert most.tolist() == pytest.approx([0.01, 0.45, 1.01])
    equal = headroom_bucket_scores(np.ones(3), np.ones(3), ttft_weight=0.8, tpot_weight=0.2, strategy="least")
    assert equal.tolist() == pytest.approx([0.51, 0.51, 0.51])


def test_bucket_scores_blend_both_dimensions():
    scores = headroom_bucket_scores(np.array([0.0, 10.0]), np.array([10.0, 0.0]), ttft_weight=0.8,
                                    tpot_weight=0.2, strategy="least")  # fmt: skip
    # c = 0.8·nT + 0.2·nP = [0.2, 0.8] → least: floor((1−c)·100)+1 = [81, 21]
    assert scores.tolist() == pytest.approx([0.81, 0.21])


def test_scorer_least_packs_and_most_spreads_within_the_positive_tier():
    cands = _with_predictions(candidates_of(make_pool(3)), [150.0, 50.0, 250.0], ttft=200)
    cycle = CycleState()
    least = _plugin(LatencyScorer).score(cycle, make_request(), cands)
    assert cycle.route is Route.PREDICTED
    assert least[0] > least[1] and least[2] == 0  # closest fit to the SLO wins; misses score 0
    most = _plugin(LatencyScorer, headroomSelectionStrategy="most").score(CycleState(), make_request(), cands)
    assert most[1] > most[0] and most[2] == 0


def test_scorer_without_slo_prefers_the_lowest_prediction_after_idle_pods():
    pool = make_pool(3)
    for address in addresses(3):
        pool.add_inflight(address, 1, 0, 0)
    cands = _with_predictions(candidates_of(pool), [300.0, 100.0, 200.0])
    scores = _plugin(LatencyScorer).score(CycleState(), make_request(), cands)
    assert np.argmax(scores) == 1 and scores[0] < scores[2] < scores[1]
    # An idle pod (nothing in flight from this router) is preferred even with a worse prediction.
    pool.add_inflight(addresses(3)[0], -1, 0, 0)
    cands = _with_predictions(candidates_of(pool), [300.0, 100.0, 200.0])
    scores = _plugin(LatencyScorer).score(CycleState(), make_request(), cands)
    assert scores[0] > 0 and scores[1] == 0 and scores[2] == 0


def test_scorer_deficit_buckets_prefer_tpot_only_misses():
    pool = make_pool(3)
    for address in addresses(3):
        pool.add_inflight(address, 1, 0, 0)
    # pod0 misses both, pod1 misses TTFT only, pod2 misses TPOT only.
    cands = _with_predictions(candidates_of(pool), [300.0, 300.0, 100.0], [90.0, 10.0, 90.0],
                              ttft=200, tpot=50, streaming=True)  # fmt: skip
    scores = _plugin(LatencyScorer).score(CycleState(), make_request(), cands)
    assert scores.tolist()[:2] == [0.0, 0.0] and scores[2] > 0


def test_scorer_composite_fallback_without_predictions():
    pool = make_pool(3, waiting=[0, 2, 4], kv_usage=[0.5, 0.0, 0.25])
    cands = _with_prefix(candidates_of(pool), [0, 0, 10])
    cycle = CycleState()
    scores = _plugin(LatencyScorer).score(cycle, make_request(), cands)
    assert cycle.route is Route.FALLBACK
    # thirds of free KV, relative queue ((4 − q)/4) and prefix match
    expected = [(0.5 + 1.0 + 0) / 3, (1.0 + 0.5 + 0) / 3, (0.75 + 0.0 + 1.0) / 3]
    assert scores.tolist() == pytest.approx([round(v * 100) / 100 for v in expected])


def test_scorer_marks_explored_routes():
    cands = _with_predictions(candidates_of(make_pool(2)), [1.0, 2.0], ttft=200)
    cycle = CycleState()
    cycle.explored = True
    _plugin(LatencyScorer).score(cycle, make_request(), cands)
    assert cycle.route is Route.EXPLORE


# --- latency-slo-admitter --------------------------------------------------------------------------
def _busy_pool(n=2, kv=0.5):
    pool = make_pool(n, running=[3] * n, kv_usage=[kv] * n)
    for address in addresses(n):
        pool.add_inflight(address, 1, 0, 0)
    return pool


def test_admitter_sheds_sheddable_requests_no_pod_can_serve():
    admitter = _plugin(LatencySloAdmitter)
    cands = _with_predictions(candidates_of(_busy_pool()), [500.0, 600.0], ttft=200)
    with pytest.raises(AdmissionDeniedError) as info:
        admitter.admit(make_request(priority=-1, slo_ttft_ms=200.0), cands)
    assert info.value.status == 429
    assert info.value.headers["x-slorouter-dropped-reason"] == "slo-unattainable"


@pytest.mark.parametrize(
    ("request_fields", "predictions", "pool_kwargs"),
    [
        ({"priority": 0, "slo_ttft_ms": 200.0}, [500.0, 600.0], {}),  # not sheddable
        ({"priority": -1}, [500.0, 600.0], {}),  # no SLO: cannot judge
        ({"priority": -1, "slo_ttft_ms": 200.0}, [100.0, 600.0], {}),  # one pod is predicted to make it
        ({"priority": -1, "slo_ttft_ms": 200.0}, [500.0, 600.0], {"kv": 0.01}),  # cold pods
        ({"priority": -1, "slo_ttft_ms": 200.0}, None, {}),  # no predictions: fail open
    ],
)
def test_admitter_admits(request_fields, predictions, pool_kwargs):
    cands = candidates_of(_busy_pool(**pool_kwargs))
    if predictions is not None:
        _with_predictions(cands, predictions, ttft=request_fields.get("slo_ttft_ms"))
    _plugin(LatencySloAdmitter).admit(make_request(**request_fields), cands)


def test_admitter_counts_idle_pods_as_able():
    pool = make_pool(2, running=[0, 3], kv_usage=[0.5, 0.5])
    pool.add_inflight(addresses(2)[1], 1, 0, 0)
    cands = _with_predictions(candidates_of(pool), [500.0, 600.0], ttft=200)
    _plugin(LatencySloAdmitter).admit(make_request(priority=-1, slo_ttft_ms=200.0), cands)


# --- prediction-profile-handler --------------------------------------------------------------------
def test_prediction_profile_handler_routes_by_the_request_flag():
    from slorouter.scheduling.loader import build_scheduler_setup

    config = {
        "plugins": [
            {"type": "prediction-profile-handler"},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
        ],
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]},
            {"name": "predicted-latency", "plugins": [{"pluginRef": "kv-cache-utilization-scorer"}]},
        ],
    }
    setup = build_scheduler_setup(config, make_ctx())
    cands = candidates_of(make_pool(2))
    on = setup.scheduler.schedule(make_request(use_prediction=True), cands)
    off = setup.scheduler.schedule(make_request(use_prediction=False), cands)
    assert on.primary_profile == "predicted-latency"
    assert off.primary_profile == "default"
    # The producer could not predict (warming up): heuristics decide, and the route says so.
    warming = make_request(use_prediction=True)
    warming.prediction_unavailable = "warming-up"
    fallback = setup.scheduler.schedule(warming, cands)
    assert fallback.primary_profile == "default" and fallback.primary.route == "fallback"
    assert off.primary.route == "heuristic"


def test_shipped_pipeline_routes_requests_without_predictions_by_token_load_among_warm_pods():
    """The shipped heuristic profile is llm-d's token-aware one: among pods holding ≥ 80 % of the prompt, the
    fewest uncached prefill tokens in flight plus this request's own uncached prompt — and, unlike llm-d,
    the decode tokens in flight; with no warm pod, the same over all pods — queue depth and KV-cache usage
    play no part. The loose filter's gate, without predictions, compares uncached prefill tokens in flight /
    15,928 tok/s against 18,000 ms."""
    from slorouter.scheduling.datakeys import (
        INFLIGHT_PREFILL_TOKENS,
        INFLIGHT_TOKENS,
        PREFIX_MATCH_BLOCKS,
        PREFIX_TOTAL_BLOCKS,
    )
    from slorouter.scheduling.loader import build_scheduler_setup
    from slorouter.scheduling.pipelines import PREDICTED_LATENCY_SCHEDULER_CONFIG

    config = copy.deepcopy(PREDICTED_LATENCY_SCHEDULER_CONFIG)
    for plugin in config["plugins"]:
        if plugin.get("name") == "loose-affinity-filter":
            plugin["parameters"]["explorationProbability"] = 0.0  # no random step-aside in this test
    setup = build_scheduler_setup(config, make_ctx())
    pool = make_pool(4, waiting=[0, 0, 9, 0], kv_usage=[0.1, 0.2, 0.9, 0.1])

    def schedule(matched: list[int], tokens: list[int], decode: list[int] | None = None) -> str:
        cands = candidates_of(pool)
        cands.attrs[PREFIX_MATCH_BLOCKS] = np.array(matched, dtype=np.float64)
        cands.attrs[PREFIX_TOTAL_BLOCKS] = np.full(4, 10.0)
        cands.attrs[INFLIGHT_PREFILL_TOKENS] = np.array(tokens, dtype=np.float64)
        cands.attrs[INFLIGHT_TOKENS] = np.array(tokens, dtype=np.float64) + np.array(decode or [0] * 4)
        warming = make_request(use_prediction=True, prompt_tokens=1000)
        warming.prediction_unavailable = "warming-up"
        result = setup.scheduler.schedule(warming, cands)
        assert result.primary_profile == "default" and result.primary.route == "fallback"
        return result.primary.targets[0].address

    a = addresses(4)
    # Pods 1 and 2 are warm (9/10 and 8/10 blocks): 5000 + 100 vs 3000 + 200 tokens; pod 2 despite its queue.
    assert schedule([0, 9, 8, 0], [0, 5000, 3000, 0]) == a[2]
    # Decode tokens count: 0 + 1000 + 100 vs 0 + 8000 + 200.
    assert schedule([0, 9, 8, 0], [0, 0, 0, 0], decode=[0, 1000, 8000, 0]) == a[1]
    # Nobody warm: 4000 + 1000, 100 + 500, 9000 + 1000, 50 + 1000 — the half-cached pod 1 wins.
    assert schedule([0, 5, 0, 0], [4000, 100, 9000, 50]) == a[1]
    # Warm pod 1 estimated 200,000 / 15,928 ≈ 12.6 s behind: within 18 s, it stays sticky.
    assert schedule([0, 9, 0, 0], [0, 200_000, 0, 0]) == a[1]
    # 300,000 tokens ≈ 18.8 s behind: the gate opens every pod, and the least loaded cold one wins.
    assert schedule([0, 9, 0, 0], [10, 300_000, 0, 20]) == a[2]


def test_prediction_profile_handler_requires_its_profiles():
    from slorouter.scheduling.config_schema import SchedulerConfigError
    from slorouter.scheduling.loader import build_scheduler_setup

    config = {
        "plugins": [{"type": "prediction-profile-handler"}, {"type": "queue-scorer"}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}],
    }
    with pytest.raises(SchedulerConfigError, match="missing: predicted-latency"):
        build_scheduler_setup(config, make_ctx())


def test_the_shipped_example_is_the_built_in_predicted_latency_pipeline():
    from pathlib import Path

    import yaml

    from slorouter.config import load_config
    from slorouter.scheduling.loader import build_scheduler_setup
    from slorouter.scheduling.pipelines import (
        PREDICTED_LATENCY_SCHEDULER_CONFIG,
        PREDICTION_RANKING_SCHEDULER_CONFIG,
    )

    path = Path(__file__).resolve().parents[2] / "examples" / "predicted-latency.yaml"
    config = load_config(path)
    assert config.scheduler == PREDICTED_LATENCY_SCHEDULER_CONFIG
    assert config.prediction_enabled and config.objective_priorities() == {"critical": 10, "batch": -1}
    setup = build_scheduler_setup(config.scheduler, make_ctx())
    assert setup.scheduler.profile_names == ["default", "predicted-latency"]
    assert yaml.safe_load(path.read_text())["predictor"]["mode"] == "embedded"
    ranking = Path(__file__).resolve().parents[2] / "examples" / "predicted-ranking.yaml"
    assert load_config(ranking).scheduler == PREDICTION_RANKING_SCHEDULER_CONFIG
