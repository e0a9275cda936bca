"""llm-d's token-aware routing ("Sticky Until Saturated"): the token-load scorer on uncached prefill tokens,
the in-flight load producer, and the prefix-affinity filter's TTFT load gate on predictions or on in-flight
tokens / peak prefill throughput."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from slorouter.bench.policies import resolve_policy
from slorouter.scheduling.config_schema import SchedulerConfigError
from slorouter.scheduling.datakeys import (
    INFLIGHT_PREFILL_TOKENS,
    INFLIGHT_REQUESTS,
    INFLIGHT_TOKENS,
    PREDICTED_TTFT_MS,
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_TOTAL_BLOCKS,
)
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.pipelines import PREDICTED_LATENCY_SCHEDULER_CONFIG
from slorouter.scheduling.plugin import PluginParams
from slorouter.scheduling.plugins.inflight import InflightLoadProducer, TokenLoadParams, TokenLoadScorer
from slorouter.scheduling.plugins.latency import AffinityParams, PrefixCacheAffinityFilter
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest
from tests.helpers.scheduling import (
    addresses,
    bits,
    candidates_of,
    make_ctx,
    make_pool,
    make_request,
    random_candidates,
)


def _candidates(
    n: int,
    *,
    matched: list[float] | None = None,
    total: float = 10,
    block_size: int | None = None,
    prefill: list[float] | None = None,
    inflight: list[float] | None = None,
    predicted: list[float] | None = None,
) -> Candidates:
    cands = candidates_of(make_pool(n))
    if matched is not None:
        cands.attrs[PREFIX_MATCH_BLOCKS] = np.array(matched, dtype=np.float64)
        cands.attrs[PREFIX_TOTAL_BLOCKS] = np.full(n, float(total))
        if block_size is not None:
            cands.attrs[PREFIX_BLOCK_SIZE_TOKENS] = np.full(n, block_size, dtype=np.int64)
    if prefill is not None:
        cands.attrs[INFLIGHT_PREFILL_TOKENS] = np.array(prefill, dtype=np.float64)
    if inflight is not None:
        cands.attrs[INFLIGHT_TOKENS] = np.array(inflight, dtype=np.float64)
    if predicted is not None:
        cands.attrs[PREDICTED_TTFT_MS] = np.array(predicted, dtype=np.float64)
    return cands


def _score(cands: Candidates, prompt_tokens: int = 0, **params: object) -> list[float]:
    scorer = TokenLoadScorer("", TokenLoadParams.model_validate(params), make_ctx())
    request = make_request(prompt_tokens=prompt_tokens)
    listed = scorer.score_list(CycleState(), request, cands)
    vector = scorer.score(CycleState(), request, cands)
    assert bits(listed) == bits(vector)
    return listed


# --- token-load-scorer ---------------------------------------------------------------------------------
def test_default_load_is_uncached_prefill_in_flight_plus_the_requests_own_uncached_prompt():
    # prompt 2000 tokens in 125 blocks of 16; 125, 62, 0 matched → own 0, 1008, 2000; T = 10000.
    cands = _candidates(
        3, matched=[125, 62, 0], total=125, block_size=16, prefill=[0, 1000, 3000], inflight=[9e3] * 3
    )
    assert _score(cands, 2000, queueThresholdTokens=10_000) == [1.0, 1 - 2008 / 10_000, 0.5]


def test_own_term_counts_the_tail_beyond_the_indexed_blocks():
    """llm-d: (total − matched) × block size + the prompt's tail beyond the indexed blocks."""
    # A 10,000-token prompt indexed up to 256 blocks × 16 = 4,096 tokens; 256, 100, 0 blocks held.
    cands = _candidates(3, matched=[256, 100, 0], total=256, block_size=16, prefill=[0, 0, 0])
    own = [10_000 - 4096, 10_000 - 1600, 10_000]
    assert _score(cands, 10_000, queueThresholdTokens=100_000) == [1 - t / 100_000 for t in own]
    # A trailing partial block: 63 blocks of 16 (1,008 tokens) cover a 1,000-token prompt; never below 0.
    full = _candidates(2, matched=[63, 62], total=63, block_size=16, prefill=[0, 0])
    assert _score(full, 1000, queueThresholdTokens=1000) == [1.0, 1 - 8 / 1000]


def test_without_the_block_size_the_own_term_scales_the_prompt_by_the_matched_share():
    # prompt 2000 tokens; match 10/10, 5/10, 0/10 → own 0, 1000, 2000; in flight 0, 1000, 3000; T = 10000.
    cands = _candidates(3, matched=[10, 5, 0], prefill=[0, 1000, 3000], inflight=[9000, 9000, 9000])
    assert _score(cands, 2000, queueThresholdTokens=10_000) == pytest.approx([1.0, 0.8, 0.5])


def test_own_term_prefers_the_warm_pod_when_in_flight_loads_are_equal():
    cands = _candidates(2, matched=[8, 2], prefill=[500, 500])
    cold, warm = 1 - (500 + 800) / 4_194_304, 1 - (500 + 200) / 4_194_304
    assert _score(cands, 1000) == pytest.approx([warm, cold])


def test_decode_tokens_count_only_with_count_decode_tokens():
    cands = _candidates(2, matched=[0, 0], prefill=[100, 100], inflight=[100, 5100])
    equal = _score(cands, 400, queueThresholdTokens=10_000)
    assert equal == pytest.approx([0.95, 0.95])
    with_decode = _score(cands, 400, queueThresholdTokens=10_000, countDecodeTokens=True)
    assert with_decode == pytest.approx([0.95, 0.45])


def test_without_the_own_term_and_with_decode_tokens_it_is_the_previous_scorer():
    """1 − min(t, T)/T on prefill + decode tokens in flight; t ≤ 0 → 1."""
    cands = _candidates(5, matched=[0, 10, 3, 0, 0], prefill=[0] * 5, inflight=[-5, 0, 1000, 4000, 9000])
    old = {"queueThresholdTokens": 4000, "countDecodeTokens": True, "countRequestTokens": False}
    assert _score(cands, 3000, **old) == [1.0, 1.0, 0.75, 0.0, 0.0]


def test_without_prefix_data_the_own_term_is_the_whole_prompt_everywhere():
    cands = _candidates(2, prefill=[0, 500])
    assert _score(cands, 1000, queueThresholdTokens=4000) == [0.75, 0.625]
    no_blocks = _candidates(2, matched=[0, 0], total=0, prefill=[0, 500])  # prompt shorter than a block
    assert _score(no_blocks, 1000, queueThresholdTokens=4000) == [0.75, 0.625]


def test_missing_in_flight_data_counts_as_zero():
    assert _score(_candidates(2), 0) == [1.0, 1.0]
    assert _score(_candidates(2, matched=[10, 0]), 1000, queueThresholdTokens=4000) == [1.0, 0.75]
    assert _score(_candidates(2), 1000, countRequestTokens=False) == [1.0, 1.0]


def test_load_above_the_threshold_scores_zero():
    cands = _candidates(2, matched=[0, 0], prefill=[3500, 0])
    assert _score(cands, 1000, queueThresholdTokens=4000) == [0.0, 0.75]


def test_token_load_defaults():
    params = TokenLoadParams()
    assert params.queue_threshold_tokens == 4_194_304
    assert params.count_request_tokens is True and params.count_decode_tokens is False
    cands = _candidates(1, prefill=[1_048_576])
    assert _score(cands, 0) == [0.75]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"queueThresholdTokens": 0}, "queueThresholdTokens: input should be greater than 0"),
        ({"countDecodeTokens": "sometimes"}, "countDecodeTokens: input should be a valid boolean"),
        ({"countRequestTokens": [1]}, "countRequestTokens: input should be a valid boolean"),
        ({"addEstimatedOutputTokens": True}, "addEstimatedOutputTokens"),
    ],
)
def test_token_load_parameter_errors_name_the_field(params, message):
    config = {"plugins": [{"type": "token-load-scorer", "parameters": params}]}
    with pytest.raises(SchedulerConfigError, match=f"token-load-scorer.*{message}"):
        build_scheduler_setup(config, make_ctx())


def test_list_and_numpy_paths_agree_for_every_parameter_combination():
    rng = np.random.default_rng(11)
    for threshold in (1, 1000, 4_194_304):
        for decode in (False, True):
            for own in (False, True):
                params = TokenLoadParams(
                    queueThresholdTokens=threshold, countDecodeTokens=decode, countRequestTokens=own
                )
                scorer = TokenLoadScorer("", params, make_ctx())
                for _ in range(60):
                    cands = random_candidates(rng, int(rng.integers(1, 17)))
                    cands.attrs[INFLIGHT_PREFILL_TOKENS] = cands.column("inflight_prefill_tokens")
                    block = int(rng.choice([1, 16, 64]))
                    cands.attrs[PREFIX_BLOCK_SIZE_TOKENS] = np.full(len(cands), block, dtype=np.int64)
                    for key in (
                        INFLIGHT_PREFILL_TOKENS,
                        INFLIGHT_TOKENS,
                        PREFIX_MATCH_BLOCKS,
                        PREFIX_BLOCK_SIZE_TOKENS,
                    ):
                        if rng.random() < 0.15:
                            del cands.attrs[key]
                    if PREFIX_MATCH_BLOCKS in cands.attrs and rng.random() < 0.2:  # floats, even NaN
                        cands.attrs[PREFIX_MATCH_BLOCKS] = rng.choice([0.5, 3.0, np.nan, np.inf], len(cands))
                    request = make_request(prompt_tokens=int(rng.choice([0, 1, 20, 777, 100_000])))
                    expected = scorer.score(CycleState(), request, cands)
                    assert bits(scorer.score_list(CycleState(), request, cands)) == bits(expected)


# --- inflight-load-producer ----------------------------------------------------------------------------
def test_inflight_load_producer_reads_router_counters():
    pool = make_pool(3)
    a = addresses(3)
    pool.add_inflight(a[0], requests=2, prefill_tokens=100, decode_tokens=50)
    pool.add_inflight(a[2], requests=1, prefill_tokens=0, decode_tokens=7)
    cands = candidates_of(pool)
    InflightLoadProducer("", PluginParams(), make_ctx()).produce(make_request(), cands)
    np.testing.assert_array_equal(cands.attrs[INFLIGHT_PREFILL_TOKENS], [100, 0, 0])
    np.testing.assert_array_equal(cands.attrs[INFLIGHT_TOKENS], [150, 0, 7])
    np.testing.assert_array_equal(cands.attrs[INFLIGHT_REQUESTS], [2, 0, 1])


# --- prefix-cache-affinity-filter: TTFT load gate ------------------------------------------------------
def _filter(**params: object) -> PrefixCacheAffinityFilter:
    params = {"explorationProbability": 0.0, **params}
    return PrefixCacheAffinityFilter("", AffinityParams.model_validate(params), make_ctx())


def _kept(f: PrefixCacheAffinityFilter, cands: Candidates, request: InferenceRequest | None = None) -> int:
    return len(f.filter(CycleState(), request or make_request(), cands))


def test_affinity_defaults():
    p = AffinityParams()
    assert (p.ttft_source, p.peak_prefill_throughput, p.max_ttft_penalty_ms) == ("auto", 15928.0, None)
    assert (p.affinity_threshold, p.exploration_probability) == (0.80, 0.01)


def test_throughput_gate_opens_when_the_best_warm_pod_is_more_than_18_s_behind():
    """Estimated TTFT = uncached prefill tokens in flight / 15,928 tok/s; 18,000 ms ↔ 286,704 tokens."""
    f = _filter()  # auto, no predictions: the throughput estimate with its 18,000 ms default
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[286_704, 0])) == 1  # exactly 18 s: sticky
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[286_705, 0])) == 2
    # The difference counts: 300k alone is 18.8 s, but the cold pod has 100k (6.3 s) in flight too.
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[300_000, 0])) == 2
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[300_000, 100_000])) == 1


def test_throughput_gate_compares_the_best_warm_with_the_best_cold_pod():
    cands = _candidates(4, matched=[10, 9, 0, 0], prefill=[900_000, 200_000, 50_000, 0])
    assert _kept(_filter(), cands) == 2  # 200k vs 0 tokens: 12.6 s behind


def test_throughput_gate_uses_peak_prefill_throughput_and_the_penalty():
    f = _filter(peakPrefillThroughput=1000, maxTTFTPenaltyMs=500)
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[600, 0])) == 2  # 600 ms behind
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[500, 0])) == 1  # 500 ms: not more than


def test_throughput_gate_ignores_decode_tokens():
    cands = _candidates(2, matched=[10, 0], prefill=[0, 0], inflight=[10_000_000, 0])
    assert _kept(_filter(), cands) == 1


def test_auto_gates_on_predictions_when_there_are_some_with_the_5_s_default():
    f = _filter()
    slow = _candidates(2, matched=[10, 0], predicted=[7000.0, 1000.0], prefill=[0, 10_000_000])
    assert _kept(f, slow) == 2  # 6 s behind on predictions; the tokens say the opposite and are not read
    fine = _candidates(2, matched=[10, 0], predicted=[5900.0, 1000.0], prefill=[10_000_000, 0])
    assert _kept(f, fine) == 1


def test_latency_predictor_source_is_inert_without_predictions():
    f = _filter(ttftSource="latencyPredictor")
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[10_000_000, 0])) == 1
    assert _kept(f, _candidates(2, matched=[10, 0], predicted=[5001.0, 0.0])) == 2


@pytest.mark.parametrize("source", ["prefillThroughput", "peakPrefillThroughput"])
def test_throughput_source_ignores_predictions(source):
    f = _filter(ttftSource=source)
    cands = _candidates(2, matched=[10, 0], predicted=[60_000.0, 0.0], prefill=[286_705, 0])
    assert _kept(f, cands) == 2
    cands = _candidates(2, matched=[10, 0], predicted=[60_000.0, 0.0], prefill=[286_704, 0])
    assert _kept(f, cands) == 1
    assert _kept(f, _candidates(2, matched=[10, 0], predicted=[60_000.0, 0.0])) == 1  # no tokens: inert


def test_an_explicit_penalty_applies_to_whichever_source_is_used():
    f = _filter(maxTTFTPenaltyMs=1000)
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[15_929, 0])) == 2  # 1.00006 s on the estimate
    assert _kept(f, _candidates(2, matched=[10, 0], prefill=[15_928, 0])) == 1
    assert _kept(f, _candidates(2, matched=[10, 0], predicted=[1001.0, 0.0])) == 2


def test_zero_penalty_disables_the_gate_on_every_source():
    for source in ("auto", "latencyPredictor", "prefillThroughput"):
        f = _filter(ttftSource=source, maxTTFTPenaltyMs=0)
        cands = _candidates(2, matched=[10, 0], predicted=[1e9, 0.0], prefill=[1e12, 0])
        assert _kept(f, cands) == 1


def test_gate_does_not_run_when_every_or_no_candidate_is_warm():
    f = _filter()
    assert _kept(f, _candidates(2, matched=[10, 9], prefill=[1e12, 0])) == 2
    assert _kept(f, _candidates(2, matched=[1, 0], prefill=[1e12, 0])) == 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"ttftSource": "bogus"},
            "ttftSource: input should be 'auto', 'latencyPredictor', 'expectedLatency'",
        ),
        ({"peakPrefillThroughput": 0}, "peakPrefillThroughput: input should be greater than 0"),
        ({"peakPrefillThroughput": -5}, "peakPrefillThroughput: input should be greater than 0"),
        ({"peakPrefillThroughput": float("inf")}, "peakPrefillThroughput: input should be a finite number"),
        ({"peakPrefillThroughput": "fast"}, "peakPrefillThroughput: input should be a valid number"),
        ({"maxTTFTPenaltyMs": -1}, "maxTTFTPenaltyMs: input should be greater than or equal to 0"),
    ],
)
def test_affinity_parameter_errors_name_the_field(params, message):
    config = {"plugins": [{"type": "prefix-cache-affinity-filter", "parameters": params}]}
    with pytest.raises(SchedulerConfigError, match=f"prefix-cache-affinity-filter.*{message}"):
        build_scheduler_setup(config, make_ctx())


def test_the_filter_brings_its_producers():
    setup = build_scheduler_setup({"plugins": [{"type": "prefix-cache-affinity-filter"}]}, make_ctx())
    assert {"approx-prefix-cache-producer", "inflight-load-producer"} <= set(setup.auto_created)


# --- the token-aware policy and the shipped pipeline's warm-up profile --------------------------------
def test_token_aware_policy_is_llm_ds_benchmarked_configuration():
    policy = resolve_policy("token-aware")
    (affinity,) = [p for p in policy.config["plugins"] if p["type"] == "prefix-cache-affinity-filter"]
    assert affinity["parameters"] == {
        "affinityThreshold": 0.8,
        "explorationProbability": 0.0,
        "ttftSource": "peakPrefillThroughput",
        "peakPrefillThroughput": 15928,
        "maxTTFTPenaltyMs": 18000,
    }
    (scorer,) = [p for p in policy.config["plugins"] if p["type"] == "token-load-scorer"]
    assert "parameters" not in scorer  # llm-d's current defaults
    setup = build_scheduler_setup(policy.config, make_ctx())

    def pick(matched: list[float], prefill: list[float], prompt_tokens: int) -> str:
        cands = _candidates(3, matched=matched, prefill=prefill)
        request = make_request(prompt_tokens=prompt_tokens)
        return setup.scheduler.schedule(request, cands).primary.targets[0].address

    a = addresses(3)
    assert pick([10, 8, 0], [40_000, 30_000, 0], 8000) == a[1]  # warm pods only: 30k + 1.6k < 40k + 0
    assert pick([10, 0, 0], [300_000, 5_000, 0], 8000) == a[2]  # gate open (18.8 s): 0 + 8k wins
    assert pick([0, 5, 0], [3000, 1000, 0], 8000) == a[1]  # nobody warm: 1k + 4k < 0 + 8k


def test_shipped_warm_up_filter_gates_on_predictions_when_there_are_some():
    """The warm-up profile's filter leaves maxTTFTPenaltyMs to its per-source default: 5,000 ms on
    predictions, 18,000 ms on the throughput estimate."""
    config = copy.deepcopy(PREDICTED_LATENCY_SCHEDULER_CONFIG)
    (loose,) = [p for p in config["plugins"] if p.get("name") == "loose-affinity-filter"]
    assert "maxTTFTPenaltyMs" not in loose["parameters"] and "ttftSource" not in loose["parameters"]
    setup = build_scheduler_setup(config, make_ctx())
    f = setup.plugins["loose-affinity-filter"]
    assert isinstance(f, PrefixCacheAffinityFilter)
    gate = f.gate_ttft_ms(_candidates(2, matched=[10, 0], predicted=[6000.0, 0.0], prefill=[0, 0]))
    assert gate is not None and gate[1] == 5000.0 and gate[0].tolist() == [6000.0, 0.0]
    gate = f.gate_ttft_ms(_candidates(2, matched=[10, 0], prefill=[15_928, 0]))
    assert gate is not None and gate[1] == 18000.0 and gate[0].tolist() == [1000.0, 0.0]


def test_shipped_warm_up_profile_counts_decode_tokens_too():
    """llm-d's token-aware load plus the decode tokens in flight (see docs/plugins.md for the measurement)."""
    config = copy.deepcopy(PREDICTED_LATENCY_SCHEDULER_CONFIG)
    (scorer,) = [p for p in config["plugins"] if p["type"] == "token-load-scorer"]
    assert scorer["parameters"] == {"countDecodeTokens": True}
    for plugin in config["plugins"]:
        if plugin.get("name") == "loose-affinity-filter":
            plugin["parameters"]["explorationProbability"] = 0.0
    setup = build_scheduler_setup(config, make_ctx())
    cands = _candidates(3, matched=[0, 6, 0], prefill=[0, 1500, 1000], inflight=[3000, 1500, 1000])
    warming = make_request(use_prediction=True, prompt_tokens=4000)
    warming.prediction_unavailable = "warming-up"
    result = setup.scheduler.schedule(warming, cands)
    # loads 3000 + 4000, 1500 + 1600, 1000 + 4000 (no block size attached: the own term is the prompt × the
    # unmatched share): the 60 %-cached pod wins although it has the most prefill in flight
    assert result.primary_profile == "default" and result.primary.targets[0].address == addresses(3)[1]


def test_the_expected_latency_gate_reads_the_load_model_and_falls_back_to_the_throughput_estimate():
    from slorouter.scheduling.datakeys import EXPECTED_TTFT_MS

    f = PrefixCacheAffinityFilter(
        "",
        AffinityParams.model_validate({"ttftSource": "expectedLatency", "maxTTFTPenaltyMs": 500}),
        make_ctx(),
    )
    cands = _candidates(2, matched=[10, 0], prefill=[15_928, 0])
    gate = f.gate_ttft_ms(cands)  # no load model yet: llm-d's estimate at its own 18 s
    assert gate is not None and gate[1] == 18000.0 and gate[0].tolist() == [1000.0, 0.0]
    cands.attrs[EXPECTED_TTFT_MS] = np.array([900.0, 300.0])
    gate = f.gate_ttft_ms(cands)
    assert gate is not None and gate[1] == 500.0 and gate[0].tolist() == [900.0, 300.0]
    request = make_request(prompt_tokens=100)
    assert len(f.filter(CycleState(), request, cands)) == 2  # 600 ms > 500: the gate opens
    cands.attrs[EXPECTED_TTFT_MS] = np.array([700.0, 300.0])
    assert f.filter(CycleState(), request, cands).endpoints[0].address == addresses(2)[0]  # 400 ms: sticky
