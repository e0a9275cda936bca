"""The load-latency producer and the expected-latency scorer: TTFT in milliseconds from the router's load
counters, with a pooled online fit and a learned speed per pod."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slorouter.director import Director
from slorouter.pool.state import Endpoint, PoolState
from slorouter.scheduling.datakeys import (
    DECODE_PACE_MS,
    EXPECTED_TTFT_MS,
    INFLIGHT_PREFILL_TOKENS,
    OWN_PREFILL_MS,
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_TOTAL_BLOCKS,
)
from slorouter.scheduling.plugin import ResponseInfo
from slorouter.scheduling.plugins.inflight import TokenLoadParams, TokenLoadScorer
from slorouter.scheduling.plugins.load_latency import (
    BatchSlotQueue,
    DecodePace,
    ExpectedLatencyScorer,
    ExpectedLatencyScorerParams,
    LoadLatencyFit,
    LoadLatencyParams,
    LoadLatencyProducer,
    PodSpeeds,
    load_terms,
)
from slorouter.scheduling.plugins.load_latency import producer as load_latency_producer
from slorouter.scheduling.types import CycleState, InferenceRequest, ProfileRunResult, Route, SchedulingResult
from tests.helpers.scheduling import (
    addresses,
    candidates_of,
    make_ctx,
    make_director,
    make_pool,
    make_request,
    produced,
)
from tests.scheduling.fake_plugins import PIN_HEADER


def _truth(work: np.ndarray, decode: np.ndarray) -> np.ndarray:
    """A pool whose TTFT is 20 ms + 0.08 ms per token of work, slowed by the decode context."""
    return 20.0 + 0.08 * work * (1.0 + decode / 200_000.0)


def _terms(work: np.ndarray | float, decode: np.ndarray | float = 0.0, queue: np.ndarray | float = 0.0):
    work, decode, queue = np.atleast_1d(work), np.atleast_1d(decode), np.atleast_1d(queue)
    queue = np.broadcast_to(queue, work.shape)
    return load_terms(queue, work, np.broadcast_to(decode, work.shape))


def _train(
    fit: LoadLatencyFit,
    pods: list[str],
    speeds: dict[str, float | tuple[float, float]],
    n: int,
    seed: int = 0,
    max_work: float = 20_000.0,
) -> None:
    """``speeds``: one factor per pod, or (fixed-cost factor, prompt-work factor)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        pod = pods[rng.integers(len(pods))]
        work, decode = rng.uniform(0, max_work), rng.uniform(0, 400_000)
        terms = _terms(work, decode)[0]
        speed = speeds[pod]
        fixed_speed, work_speed = speed if isinstance(speed, tuple) else (speed, speed)
        truth = float(_truth(np.array([work]), np.array([decode]))[0])
        ttft = fixed_speed * 20.0 + work_speed * (truth - 20.0)
        fit.observe(pod, terms, ttft * math.exp(rng.normal(0, 0.05)))


def test_the_pooled_fit_recovers_a_linear_pool():
    fit = LoadLatencyFit()
    _train(fit, ["a", "b"], {"a": 1.0, "b": 1.0}, 600)
    work = np.array([0.0, 5_000.0, 20_000.0, 20_000.0])
    decode = np.array([0.0, 100_000.0, 0.0, 400_000.0])
    expected = fit.expected_ms(_terms(work, decode), ["a"] * 4)
    assert expected is not None
    np.testing.assert_allclose(expected, _truth(work, decode), rtol=0.08, atol=3.0)


def test_a_slower_pod_learns_its_speed_relative_to_the_pool():
    """2.2× slower, learned as about 2× (the prior keeps some of it back); the pool's typical pod stays at 1.
    Its fixed costs (20 ms against up to 1.6 s of prompt work here) carry little evidence, so their speed
    stays nearer the prior; the expectation, dominated by the work, is still about 2× the fast pods'."""
    fit = LoadLatencyFit(speed_prior_samples=16.0)
    _train(fit, ["fast1", "fast2", "slow"], {"fast1": 1.0, "fast2": 1.0, "slow": 2.2}, 1500)
    fast1, fast2, slow = (np.array(fit.speeds.of(p)) for p in ("fast1", "fast2", "slow"))
    fixed_ratio, work_ratio = slow / np.sqrt(fast1 * fast2)
    assert 1.8 <= work_ratio <= 2.3
    assert 1.1 <= fixed_ratio <= 2.3
    np.testing.assert_allclose(fast1, fast2, rtol=0.1)
    terms = _terms(np.array([8_000.0, 8_000.0]))
    expected = fit.expected_ms(terms, ["fast1", "slow"])
    assert expected is not None
    assert 1.8 <= expected[1] / expected[0] <= 2.3


def test_a_pod_slow_only_in_compute_is_slow_on_long_prompts_and_not_on_short_ones():
    """An A100 among H100s: its fixed costs (weight reads) 1.6× slower, its prompt work 3.2×. One factor would
    be learned between the two and be wrong for both; the two speeds are learned apart."""
    fit = LoadLatencyFit(speed_prior_samples=16.0)
    speeds: dict[str, float | tuple[float, float]] = {"h1": 1.0, "h2": 1.0, "h3": 1.0, "a100": (1.6, 3.2)}
    _train(fit, list(speeds), speeds, 3000, max_work=2_000.0)
    base = np.sqrt(np.array(fit.speeds.of("h1")) * np.array(fit.speeds.of("h2")))
    fixed_ratio, work_ratio = np.array(fit.speeds.of("a100")) / base
    assert 1.3 <= fixed_ratio <= 1.9
    assert 2.6 <= work_ratio <= 3.5
    short, long = _terms(np.array([0.0, 0.0])), _terms(np.array([2_000.0, 2_000.0]))
    on_short, on_long = fit.expected_ms(short, ["h1", "a100"]), fit.expected_ms(long, ["h1", "a100"])
    assert on_short is not None and on_long is not None
    assert on_short[1] / on_short[0] < 2.0 < 2.4 < on_long[1] / on_long[0]


def test_speeds_are_learned_only_from_first_tokens_that_did_not_queue():
    """Where requests queue, the pooled fit's misfit grows with the queue: no pod takes it for slowness."""
    fit = LoadLatencyFit(speed_prior_samples=16.0)
    _train(fit, ["a", "b"], {"a": 1.0, "b": 1.0}, 400)
    before = fit.speeds.of("b")
    queued = load_terms(np.array([0.0]), np.array([1_000.0]), np.array([0.0]), np.array([5.0]))[0]
    slot_wait = load_terms(np.array([0.0]), np.array([1_000.0]), np.array([0.0]), None, np.array([300.0]))[0]
    for terms in (queued, slot_wait):
        for _ in range(50):
            fit.observe("b", terms, 5_000.0)
    assert fit.speeds.of("b") == before
    assert fit.samples == 500  # the pooled fit still learns from them


def test_an_unknown_pod_starts_at_the_pools_speed():
    fit = LoadLatencyFit()
    _train(fit, ["a"], {"a": 1.0}, 200)
    assert fit.speeds.of("new") == (1.0, 1.0)
    fit.forget("a")
    assert fit.speeds.of("a") == (1.0, 1.0)


def test_the_speeds_do_not_depend_on_when_they_were_read():
    """Every pod's speeds are a function of the observations alone: a router that reads them before every
    pick and one that reads them once at the end agree exactly (a cache of per-pod solutions that mixed
    fresh and stale pods did not, and cost 8 equal pods near saturation up to 2x TTFT p90)."""
    rng = np.random.default_rng(7)
    pods = [f"p{i}" for i in range(12)]
    slowness = dict(zip(pods, np.linspace(0.5, 2.0, len(pods)), strict=True))  # pods that really differ
    observations = []
    for _ in range(600):
        pod = pods[int(rng.integers(len(pods)))]
        ratio = float(slowness[pod] * rng.lognormal(0.0, 0.2))
        observations.append((pod, float(rng.uniform(0.1, 0.9)), ratio))
    read_often, read_once = PodSpeeds(), PodSpeeds()
    for step, (pod, fixed_share, ratio) in enumerate(observations):
        read_often.observe(pod, fixed_share, ratio)
        read_once.observe(pod, fixed_share, ratio)
        if step % 3:
            read_often.arrays(pods)
            read_often.of(pod)
    for got, want in zip(read_often.arrays([*pods, "new"]), read_once.arrays([*pods, "new"]), strict=True):
        np.testing.assert_array_equal(got, want)
    assert read_once.of("new") == (1.0, 1.0)


def test_nothing_is_expected_before_min_samples_or_with_a_slope_that_is_not_positive():
    fit = LoadLatencyFit(min_samples=10)
    terms = _terms(1_000.0)
    for _ in range(9):
        fit.observe("a", terms[0], 100.0)
    assert fit.expected_ms(terms, ["a"]) is None
    # TTFT falling as the work grows: no usable slope.
    fit = LoadLatencyFit(min_samples=10)
    for i in range(200):
        work = float(i * 100)
        fit.observe("a", _terms(work)[0], 1_000.0 - 0.04 * work)
    assert fit.theta is None
    assert fit.expected_ms(terms, ["a"]) is None


@pytest.mark.parametrize("ttft", [0.0, -5.0, math.nan, math.inf])
def test_meaningless_observations_are_ignored(ttft):
    fit = LoadLatencyFit(min_samples=1)
    fit.observe("a", _terms(1.0)[0], ttft)
    assert fit.samples == 0


def test_a_wild_ratio_does_not_move_the_pods_speed():
    fit = LoadLatencyFit()
    _train(fit, ["a"], {"a": 1.0}, 300)
    before = fit.speeds.of("a")
    terms = _terms(1_000.0)[0]
    fit.observe("a", terms, float(terms @ fit.theta) * 50)  # an aborted stream or a clock glitch
    assert fit.speeds.of("a") == before


def test_old_samples_fade():
    """After the pool slows down (another model, a noisy neighbour), the fit follows."""
    fit = LoadLatencyFit(half_life_samples=200, speed_half_life_samples=16)
    _train(fit, ["a", "b"], {"a": 1.0, "b": 1.0}, 600, seed=1)
    _train(fit, ["a", "b"], {"a": 2.0, "b": 2.0}, 2_000, seed=2)
    terms = _terms(10_000.0)
    expected = fit.expected_ms(terms, ["a"])
    assert expected is not None
    assert expected[0] == pytest.approx(2 * _truth(np.array([10_000.0]), np.array([0.0]))[0], rel=0.1)


# --- the plugins, through their hooks ---------------------------------------------------------------------
def _producer(min_samples: int = 3) -> LoadLatencyProducer:
    params = LoadLatencyParams.model_validate({"minSamples": min_samples})
    return LoadLatencyProducer("", params, make_ctx())


def _director(pool: PoolState, min_samples: int = 3) -> Director:
    """The producer alone in front of a picker, each request sent where its pin header says."""
    plugins = [
        {"type": "load-latency-producer", "parameters": {"minSamples": min_samples}},
        {"type": "test-pin-filter"},
        {"type": "max-score-picker"},
    ]
    profile = {
        "name": "default",
        "plugins": [{"pluginRef": "test-pin-filter"}, {"pluginRef": "max-score-picker"}],
    }
    return make_director(pool, {"plugins": plugins, "schedulingProfiles": [profile]})


def _load_latency(director: Director) -> LoadLatencyProducer:
    producer = director.setup.plugins["load-latency-producer"]
    assert isinstance(producer, LoadLatencyProducer)
    return producer


def _round(
    director: Director,
    request: InferenceRequest,
    target: str,
    ttft_ms: float,
    *,
    streaming: bool = False,
    tokens: int = 1,
    completed_s: float | None = None,
) -> None:
    """``request`` through ``director`` to ``target``: its first ``tokens`` ``ttft_ms`` after dispatch, and
    its response complete ``completed_s`` after dispatch (with the first tokens if None or if they are
    later)."""
    request.headers[PIN_HEADER] = target
    result = director.schedule(request)
    assert result.target.address == target
    lifecycle = director.dispatch(request, result)
    dispatched = director.clock.now()
    lifecycle.on_headers(200, streaming)
    director.clock.advance(ttft_ms / 1000)
    lifecycle.on_tokens(tokens)
    if completed_s is not None:
        director.clock.set(max(director.clock.now(), dispatched + completed_s))
    lifecycle.end()


def test_the_producer_learns_from_first_tokens_and_attaches_expectations_for_every_candidate():
    """TTFT = 10 ms + 0.05 ms per queued token + 0.1 ms per token of the request's own prompt."""
    pool = make_pool(2)
    director = _director(pool, min_samples=3)
    a = addresses(2)
    history = [(0, 1_000), (4_000, 2_000), (0, 9_000), (12_000, 500), (2_000, 16_000)]
    for i, (queue, own) in enumerate(history):
        pool.add_inflight(a[i % 2], 1, queue, 0)
        request = make_request(prompt_tokens=own, request_id=f"r{i}")
        _round(director, request, target=a[i % 2], ttft_ms=10 + 0.05 * queue + 0.1 * own)
        pool.add_inflight(a[i % 2], -1, -queue, 0)
    assert _load_latency(director).fit.samples == 5
    pool.add_inflight(a[1], 1, 5_000, 0)
    cands = produced(director, make_request(prompt_tokens=2_000))
    expected = cands.attrs[EXPECTED_TTFT_MS]
    assert expected.shape == (2,)
    np.testing.assert_allclose(expected, [10 + 0.1 * 2_000, 10 + 0.05 * 5_000 + 0.1 * 2_000], rtol=0.05)


def test_failed_responses_and_responses_without_a_first_token_teach_nothing():
    producer = _producer()
    cands = candidates_of(make_pool(1))
    request = make_request(prompt_tokens=100)
    producer.produce(request, cands)
    endpoint = cands.endpoint(0)
    producer.pre_request(request, SchedulingResult({"default": ProfileRunResult([endpoint])}, "default"))
    producer.on_response_body(
        request, ResponseInfo(endpoint=endpoint, status=503, dispatched_at=0.0, first_token_at=0.5),
        start_of_stream=True, end_of_stream=True,
    )  # fmt: skip
    producer.on_response_body(
        request, ResponseInfo(endpoint=endpoint, status=200, dispatched_at=0.0), start_of_stream=False,
        end_of_stream=True,
    )  # fmt: skip
    assert producer.fit.samples == 0


def test_a_pick_outside_the_candidates_is_not_learned():
    producer = _producer()
    cands = candidates_of(make_pool(2))
    request = make_request(prompt_tokens=100)
    producer.produce(request, cands)
    stranger = Endpoint("10.9.9.9:8000")
    producer.pre_request(request, SchedulingResult({"default": ProfileRunResult([stranger])}, "default"))
    response = ResponseInfo(endpoint=stranger, status=200, dispatched_at=0.0, first_token_at=0.1)
    producer.on_response_body(request, response, start_of_stream=True, end_of_stream=True)
    assert producer.fit.samples == 0


def test_a_pod_without_a_known_cap_or_service_time_has_no_slot_wait():
    slots = BatchSlotQueue()
    np.testing.assert_array_equal(slots.wait_ms(["a", "b"], np.array([500.0, 0.0])), [0.0, 0.0])
    slots.learn_caps(["a"], np.array([0]), np.array([256]))  # running without a queue: not its cap
    slots.observe_service("a", 40_000.0)
    np.testing.assert_array_equal(slots.wait_ms(["a"], np.array([500.0])), [0.0])


def test_the_slot_wait_is_places_beyond_the_cap_times_service_time_over_cap():
    """Little's law at the cap: 256 running, 40 s each, a slot frees every 156 ms; the request sent now to a
    pod with 300 in flight is the 45th beyond the cap."""
    slots = BatchSlotQueue()
    slots.learn_caps(["a", "b"], np.array([3, 0]), np.array([256, 100]))
    slots.learn_caps(["a"], np.array([5]), np.array([200]))  # a smaller running count never lowers the cap
    slots.observe_service("a", 40_000.0)
    slots.observe_service("b", 40_000.0)
    wait = slots.wait_ms(["a", "b", "c"], np.array([300.0, 300.0, 300.0]))
    np.testing.assert_allclose(wait, [45 * 40_000.0 / 256, 0.0, 0.0])
    assert slots.wait_ms(["a"], np.array([200.0]))[0] == 0.0  # below the cap


@pytest.mark.parametrize("service_ms", [0.0, -5.0, math.nan, math.inf])
def test_meaningless_service_times_are_ignored(service_ms):
    slots = BatchSlotQueue()
    slots.learn_caps(["a"], np.array([1]), np.array([4]))
    slots.observe_service("a", 1_000.0)
    slots.observe_service("a", service_ms)
    assert slots.wait_ms(["a"], np.array([4.0]))[0] == pytest.approx(1_000.0 / 4)


def test_the_producer_learns_the_slot_wait_of_a_pod_at_its_cap():
    """A pod that reports waiting requests at 4 running has a cap of 4; each request beyond it waits a
    quarter of the 2 s service time, which the fit learns from the first tokens (TTFT = 20 ms + that)."""
    pool = make_pool(2, waiting=[2, 0], running=[4, 1])
    director = _director(pool, min_samples=20)
    a = addresses(2)
    rng = np.random.default_rng(0)
    for i in range(80):
        target = i % 2
        inflight = int(rng.integers(0, 9))
        pool.add_inflight(a[target], inflight, 0, 0)
        request = make_request(prompt_tokens=0, request_id=f"r{i}")
        slot_wait = max(inflight + 1 - 4, 0) * 500.0 if target == 0 else 0.0
        _round(director, request, target=a[target], ttft_ms=20.0 + slot_wait, completed_s=2.0)
        pool.add_inflight(a[target], -inflight, 0, 0)
    pool.add_inflight(a[0], 7, 0, 0)
    pool.add_inflight(a[1], 7, 0, 0)
    cands = produced(director, make_request(prompt_tokens=0))
    expected = cands.attrs[EXPECTED_TTFT_MS]
    assert expected[0] == pytest.approx(20.0 + 4 * 500.0, rel=0.1)
    assert expected[1] == pytest.approx(20.0, rel=0.25)  # the two pods' speeds share what the fit misses


def test_the_state_of_pods_that_left_the_pool_is_dropped(monkeypatch):
    monkeypatch.setattr(load_latency_producer, "PRUNE_EVERY", 4)
    pool = make_pool(3, waiting=[1, 1, 1], running=[2, 2, 2])
    director = _director(pool, min_samples=3)
    producer = _load_latency(director)
    a = addresses(3)
    for i in range(6):
        request = make_request(prompt_tokens=100, request_id=f"r{i}")
        _round(director, request, target=a[i % 3], ttft_ms=50.0, streaming=True, tokens=20, completed_s=1.0)
    assert producer.fit.speeds.pods() == producer.slots.pods() == producer.pace.pods() == set(a)
    pool.remove(a[1])
    for i in range(4):  # the next prune
        director.schedule(make_request(prompt_tokens=100, request_id=f"s{i}"))
    assert producer.fit.speeds.pods() == producer.slots.pods() == producer.pace.pods() == {a[0], a[2]}
    assert producer.fit.samples == 6  # the pooled fit keeps what the departed pod taught it


def test_the_scorer_ranks_by_expected_latency():
    cands = candidates_of(make_pool(3))
    cands.attrs[EXPECTED_TTFT_MS] = np.array([300.0, 100.0, 70_000.0])
    scorer = ExpectedLatencyScorer("", ExpectedLatencyScorerParams.model_validate({}), make_ctx())
    scores = scorer.score(CycleState(), make_request(prompt_tokens=10), cands)
    np.testing.assert_allclose(scores, [1 - 300 / 60_000, 1 - 100 / 60_000, 0.0])


def test_without_expectations_the_scorer_scores_exactly_as_the_token_load_scorer():
    cands = candidates_of(make_pool(3))
    cands.attrs[PREFIX_MATCH_BLOCKS] = np.array([125.0, 62.0, 0.0])
    cands.attrs[PREFIX_TOTAL_BLOCKS] = np.full(3, 125.0)
    cands.attrs[PREFIX_BLOCK_SIZE_TOKENS] = np.full(3, 16, dtype=np.int64)
    cands.attrs[INFLIGHT_PREFILL_TOKENS] = np.array([0.0, 1_000.0, 3_000_000.0])
    request = make_request(prompt_tokens=2_000)
    expected_scorer = ExpectedLatencyScorer("", ExpectedLatencyScorerParams.model_validate({}), make_ctx())
    token_scorer = TokenLoadScorer("", TokenLoadParams.model_validate({}), make_ctx())
    np.testing.assert_array_equal(
        expected_scorer.score(CycleState(), request, cands), token_scorer.score(CycleState(), request, cands)
    )


# --- the interference term and the shipped pipeline ---------------------------------------------------
def test_the_interference_term_charges_the_decode_streams_a_prefill_would_stall():
    pool = make_pool(2)
    a = addresses(2)
    pool.add_inflight(a[0], 10, 0, 10_000, decoding=10)  # pod 0: ten decode streams
    cands = candidates_of(pool)
    cands.attrs[EXPECTED_TTFT_MS] = np.array([100.0, 150.0])
    cands.attrs[OWN_PREFILL_MS] = np.array([80.0, 80.0])
    request = make_request(prompt_tokens=1_000)

    def scores(weight: float) -> np.ndarray:
        params = ExpectedLatencyScorerParams.model_validate({"interferenceWeight": weight})
        cycle = CycleState()
        out = ExpectedLatencyScorer("", params, make_ctx()).score(cycle, request, cands)
        assert cycle.route == Route.PREDICTED
        return out

    assert scores(0.0).argmax() == 0  # by TTFT alone: 100 < 150 ms
    # 100 + 0.1 · 10 · 80 = 180 > 150: the idle pod wins
    np.testing.assert_allclose(scores(0.1), [1 - 180 / 60_000, 1 - 150 / 60_000])


def test_the_decode_pace_is_a_moving_mean_of_each_pods_time_per_token_after_the_first():
    pace = DecodePace(half_life_streams=1.0)  # each new stream moves the mean half way
    pace.observe("a", first_token_at=1.0, completed_at=1.99, tokens=100)  # 990 ms over 99 tokens
    np.testing.assert_allclose(pace.of(["a", "b"]), [10.0, math.nan])
    pace.observe("a", first_token_at=0.0, completed_at=0.297, tokens=100)  # 3 ms per token
    assert pace.of(["a"])[0] == pytest.approx(6.5)


@pytest.mark.parametrize(
    ("first", "completed", "tokens"),
    [(1.0, 2.0, 1), (1.0, 2.0, 0), (2.0, 1.0, 10), (1.0, 1.0, 10), (1.0, math.inf, 5)],
)
def test_streams_that_carry_no_pace_are_ignored(first, completed, tokens):
    pace = DecodePace()
    pace.observe("a", first_token_at=first, completed_at=completed, tokens=tokens)
    assert pace.pods() == set()


def test_the_producer_learns_the_pace_of_streamed_replies_only():
    pool = make_pool(2)
    director = _director(pool, min_samples=1)
    for i, streaming in enumerate([True, False]):
        request = make_request(prompt_tokens=100, request_id=f"r{i}")
        # 500 ms over 50 tokens after the first
        _round(director, request, addresses(2)[i], 20.0, streaming=streaming, tokens=51, completed_s=0.52)
    cands = produced(director, make_request(prompt_tokens=100))
    # a non-streamed reply's first token is its last: no pace for pod 1
    np.testing.assert_allclose(cands.attrs[DECODE_PACE_MS], [10.0, math.nan])


def test_the_decode_term_charges_the_requests_own_tokens_at_the_pace_beyond_the_fastest_pod():
    cands = candidates_of(make_pool(3))
    cands.attrs[EXPECTED_TTFT_MS] = np.array([100.0, 150.0, 120.0])
    cands.attrs[OWN_PREFILL_MS] = np.zeros(3)
    cands.attrs[DECODE_PACE_MS] = np.array([20.0, 10.0, math.nan])  # pod 2 has no pace yet

    def cost(weight: float, max_tokens: int, cap: int = 1024) -> np.ndarray:
        params = ExpectedLatencyScorerParams.model_validate({"decodeWeight": weight, "maxDecodeTokens": cap})
        scores = ExpectedLatencyScorer("", params, make_ctx()).score(
            CycleState(), make_request(prompt_tokens=10, max_tokens=max_tokens), cands
        )
        return (1.0 - scores) * 60_000.0

    np.testing.assert_allclose(cost(0.0, 500), [100.0, 150.0, 120.0])  # off: the TTFT alone
    # 0.02 · 500 tokens · (20 − 10) ms = 100 ms on pod 0; the fastest and the unmeasured pod pay nothing
    np.testing.assert_allclose(cost(0.02, 500), [200.0, 150.0, 120.0])
    np.testing.assert_allclose(cost(0.02, 5_000, cap=1024), [100.0 + 0.02 * 1024 * 10, 150.0, 120.0])
    cands.attrs[DECODE_PACE_MS] = np.full(3, math.nan)
    np.testing.assert_allclose(cost(0.02, 500), [100.0, 150.0, 120.0])


def test_own_prefill_is_what_the_requests_own_prompt_adds_to_the_expectation():
    pool = make_pool(2)
    director = _director(pool, min_samples=3)
    for i, work in enumerate([1_000, 4_000, 9_000, 16_000]):
        request = make_request(prompt_tokens=work, request_id=f"r{i}")
        _round(director, request, target=addresses(2)[i % 2], ttft_ms=10 + 0.1 * work)
    pool.add_inflight(addresses(2)[1], 1, 5_000, 0)
    cands = produced(director, make_request(prompt_tokens=2_000))
    # 0.1 ms per token of the request's own 2,000 on both pods; the queue ahead of it is not its own work
    np.testing.assert_allclose(cands.attrs[OWN_PREFILL_MS], [200.0, 200.0], rtol=0.05)


def test_the_load_core_pipeline_is_the_load_model_with_the_predictor_on_slos():
    from pathlib import Path

    from slorouter.config import load_config
    from slorouter.scheduling.loader import build_scheduler_setup
    from slorouter.scheduling.pipelines import PREDICTED_LATENCY_SCHEDULER_CONFIG, STICKY_AFFINITY

    profiles = PREDICTED_LATENCY_SCHEDULER_CONFIG["schedulingProfiles"]
    (profile,) = [p for p in profiles if p["name"] == "predicted-latency"]
    refs = [ref["pluginRef"] for ref in profile["plugins"]]
    assert refs == [
        "slo-headroom-tier-filter",
        "sticky-affinity-filter",
        "expected-latency-scorer",
        "max-score-picker",
    ]
    (sticky,) = [
        p for p in PREDICTED_LATENCY_SCHEDULER_CONFIG["plugins"] if p.get("name") == "sticky-affinity-filter"
    ]
    assert sticky["parameters"] == STICKY_AFFINITY
    setup = build_scheduler_setup(PREDICTED_LATENCY_SCHEDULER_CONFIG, make_ctx())
    assert isinstance(setup.plugins["load-latency-producer"], LoadLatencyProducer)
    example = Path(__file__).resolve().parents[2] / "examples" / "predicted-latency.yaml"
    assert load_config(example).scheduler == PREDICTED_LATENCY_SCHEDULER_CONFIG
