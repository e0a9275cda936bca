"""Expected TTFT from the router's own load counters, learned online from the pool's first tokens.

``load-latency-producer`` turns llm-d's token-aware load core into milliseconds. For each candidate it
takes the prefill work ahead of the request there, ``w`` = uncached prompt tokens in flight + this request's
own uncached prompt (what ``token-load-scorer`` counts), and the decode context running there, ``d`` (the
context tokens of the requests past their first token), and estimates

    TTFT ≈ speed[pod] · (θ₀ + θ₁·w + θ₂·d + θ₃·w·d)

- θ is one fit for the whole pool: exponentially weighted least squares (ridge-regularised, recent samples
  weigh more) of the observed TTFTs, each divided by its pod's speed. Why this shape: a vLLM-like engine
  drains prefill work at a rate set by its step time, and every step also carries the running decodes, so
  TTFT grows linearly with the work ahead, with a slope that grows with the decode context. A linear form
  keeps the ranking monotone in the work ahead (the token-aware core is never overridden by noise) and
  extrapolates to loads the fit has not seen, which a tree ensemble does not.
- ``speed[pod]`` is what counting tokens cannot see: how much slower or faster this pod runs than the pool's
  fit, a recency-weighted mean of its log(observed / fitted) ratios, shrunk towards 1 until the pod has
  samples (``speedPriorSamples``). A pod 2.2× slower learns ≈ 2.2 within tens of requests; on a homogeneous
  pool every speed stays near 1 and the ranking is token-aware's, with the decode context breaking its ties.

Everything it reads is router-local (in-flight counters, prefix match), so late or coarse engine metrics do
not touch it. Until the fit has ``minSamples`` first tokens (or while its slope is not positive), it attaches
nothing and the scorer falls back to counting tokens.

``expected-latency-scorer`` scores ``1 − min(expected, T)/T`` (``T`` = ``maxLatencyMs``); without the
producer's data it scores the token load exactly as ``token-load-scorer`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from slorouter.scheduling.datakeys import (
    EXPECTED_TTFT_MS,
    INFLIGHT_PREFILL_TOKENS,
    OWN_PREFILL_MS,
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_TOTAL_BLOCKS,
)
from slorouter.scheduling.plugin import (
    DataProducer,
    Plugin,
    PluginContext,
    PluginParams,
    PreRequest,
    PreRequestResult,
    ResponseBodyProcessor,
    ResponseInfo,
    Scorer,
)
from slorouter.scheduling.plugins.inflight import DEFAULT_QUEUE_THRESHOLD_TOKENS, uncached_prompt_tokens
from slorouter.scheduling.plugins.latency import EXPLORED_KEY
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest, Route, SchedulingResult

# Feature scales: they keep the normal equations well conditioned (w in thousands of tokens, d in 100k).
WORK_SCALE = 1e-3
DECODE_SCALE = 1e-5
N_TERMS = 4  # 1, w, d, w·d
MAX_LOG_RATIO = math.log(20.0)  # observations 20× off the fit (aborts, clock glitches) teach nothing


def load_terms(work_tokens: np.ndarray, decode_tokens: np.ndarray) -> np.ndarray:
    """The fit's regressors, one row per candidate: 1, w, d, w·d (scaled)."""
    w = np.asarray(work_tokens, dtype=np.float64) * WORK_SCALE
    d = np.asarray(decode_tokens, dtype=np.float64) * DECODE_SCALE
    return np.column_stack((np.ones(len(w)), w, d, w * d))


class LoadLatencyFit:
    """TTFT ≈ speed[pod] · θ·x, fitted online (see the module docstring).

    ``half_life_samples`` sets how fast old samples fade from the pooled fit and from each pod's speed;
    ``ridge`` (relative to the data's scale) regularises θ towards 0; it matters only in directions without
    samples.
    """

    def __init__(
        self,
        *,
        half_life_samples: float = 2000.0,
        speed_half_life_samples: float = 64.0,
        speed_prior_samples: float = 16.0,
        min_samples: int = 50,
        ridge: float = 1e-6,
    ) -> None:
        self._decay = 0.5 ** (1.0 / half_life_samples)
        self._speed_decay = 0.5 ** (1.0 / speed_half_life_samples)
        self._prior = speed_prior_samples
        self.min_samples = min_samples
        self._ridge = ridge
        self._gram = np.zeros((N_TERMS, N_TERMS))
        self._moment = np.zeros(N_TERMS)
        self._theta: np.ndarray | None = None
        self._dirty = False
        self.samples = 0
        # pod -> (decayed Σ log ratio, decayed count, observations seen)
        self._log_speed: dict[str, tuple[float, float, int]] = {}

    def speed(self, pod: str) -> float:
        """exp(recency-weighted mean log ratio · n/(n + prior)): 1 for a new pod, unbiased once n ≫ prior."""
        total, count, seen = self._log_speed.get(pod, (0.0, 0.0, 0))
        if count <= 0:
            return 1.0
        return math.exp(total / count * seen / (seen + self._prior))

    def speeds(self, pods: list[str]) -> np.ndarray:
        return np.array([self.speed(p) for p in pods])

    @property
    def theta(self) -> np.ndarray | None:
        """The pooled coefficients, or None while the fit is not usable (too few samples, slope ≤ 0)."""
        if self.samples < self.min_samples:
            return None
        if self._dirty:
            # Ridge relative to the Gram matrix's scale (the 1/TTFT² weights make it tiny in absolute terms).
            scale = np.trace(self._gram) / N_TERMS + 1e-300
            regularised = self._gram + (self._ridge * scale) * np.eye(N_TERMS)
            self._theta = np.linalg.solve(regularised, self._moment)
            self._dirty = False
        theta = self._theta
        if theta is None or not np.isfinite(theta).all() or theta[1] <= 0:
            return None
        return theta

    def expected_ms(self, terms: np.ndarray, pods: list[str]) -> np.ndarray | None:
        theta = self.theta
        if theta is None:
            return None
        return np.maximum(terms @ theta, 0.0) * self.speeds(pods)

    def observe(self, pod: str, terms: np.ndarray, ttft_ms: float) -> None:
        """One first token: ``terms`` as ``load_terms`` built them for this pod at dispatch."""
        if not (ttft_ms > 0 and math.isfinite(ttft_ms)):
            return
        theta = self.theta
        if theta is not None:
            fitted = float(terms @ theta)
            if fitted > 0:
                log_ratio = math.log(ttft_ms / fitted)
                if abs(log_ratio) <= MAX_LOG_RATIO:
                    total, count, seen = self._log_speed.get(pod, (0.0, 0.0, 0))
                    decay = self._speed_decay
                    self._log_speed[pod] = (total * decay + log_ratio, count * decay + 1.0, seen + 1)
        # Weighted by 1/TTFT²: the fit minimises relative error, so a 30 ms chat turn counts as much as a
        # 3 s long prompt (plain least squares would fit the long prompts and ignore the rest).
        normalised = ttft_ms / self.speed(pod)
        weight = 1.0 / (normalised * normalised)
        self._gram *= self._decay
        self._moment *= self._decay
        self._gram += weight * np.outer(terms, terms)
        self._moment += (weight * normalised) * terms
        self._dirty = True
        self.samples += 1

    def forget(self, pod: str) -> None:
        self._log_speed.pop(pod, None)


class LoadLatencyParams(PluginParams):
    half_life_samples: float = Field(2000.0, alias="halfLifeSamples", gt=0.0)
    speed_half_life_samples: float = Field(64.0, alias="speedHalfLifeSamples", gt=0.0)
    speed_prior_samples: float = Field(16.0, alias="speedPriorSamples", ge=0.0)
    min_samples: int = Field(50, alias="minSamples", ge=1)


@dataclass(slots=True)
class _Dispatch:
    pods: list[str]
    terms: np.ndarray
    target: int = -1
    observed: bool = False


@register_plugin(default_producer=True)
class LoadLatencyProducer(Plugin, DataProducer, PreRequest, ResponseBodyProcessor):
    """Attaches ``expected_ttft_ms`` per candidate (module docstring) and learns from the first tokens."""

    type_name = "load-latency-producer"
    Params = LoadLatencyParams
    params: LoadLatencyParams
    produces = (EXPECTED_TTFT_MS, OWN_PREFILL_MS)
    consumes = (INFLIGHT_PREFILL_TOKENS, PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS, PREFIX_BLOCK_SIZE_TOKENS)

    def __init__(self, name: str, params: PluginParams, ctx: PluginContext) -> None:
        super().__init__(name, params, ctx)
        p = self.params
        self.fit = LoadLatencyFit(
            half_life_samples=p.half_life_samples,
            speed_half_life_samples=p.speed_half_life_samples,
            speed_prior_samples=p.speed_prior_samples,
            min_samples=p.min_samples,
        )

    def produce(self, request: InferenceRequest, candidates: Candidates) -> None:
        own = uncached_prompt_tokens(request, candidates)
        work = candidates.column("inflight_prefill_tokens") + own
        decode = candidates.column("inflight_decode_tokens")
        terms = load_terms(work, decode)
        pods = [e.address for e in candidates.endpoints]
        request.state[self.name] = _Dispatch(pods, terms)
        theta = self.fit.theta
        if theta is None:
            return
        speeds = self.fit.speeds(pods)
        candidates.attrs[EXPECTED_TTFT_MS] = np.maximum(terms @ theta, 0.0) * speeds
        # d(TTFT)/d(work) at this pod's decode context, times the request's own work.
        slope = np.maximum(theta[1] + theta[3] * (decode * DECODE_SCALE), 0.0)
        candidates.attrs[OWN_PREFILL_MS] = slope * (own * WORK_SCALE) * speeds

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> PreRequestResult | None:
        dispatch: _Dispatch | None = request.state.get(self.name)
        if dispatch is not None:
            try:
                dispatch.target = dispatch.pods.index(result.target.address)
            except ValueError:
                dispatch.target = -1
        return None

    def on_response_body(
        self, request: InferenceRequest, response: ResponseInfo, *, start_of_stream: bool, end_of_stream: bool
    ) -> None:
        dispatch: _Dispatch | None = request.state.get(self.name)
        if dispatch is None or dispatch.observed or dispatch.target < 0 or response.first_token_at is None:
            return
        if response.error is not None or response.status not in (0, 200):
            return
        dispatch.observed = True
        i = dispatch.target
        ttft_ms = (response.first_token_at - response.dispatched_at) * 1000.0
        self.fit.observe(dispatch.pods[i], dispatch.terms[i], ttft_ms)


class ExpectedLatencyScorerParams(PluginParams):
    max_latency_ms: float = Field(60_000.0, alias="maxLatencyMs", gt=0.0, allow_inf_nan=False)
    interference_weight: float = Field(0.0, alias="interferenceWeight", ge=0.0, allow_inf_nan=False)


@register_plugin
class ExpectedLatencyScorer(Plugin, Scorer):
    """``1 − min(cost, T)/T``, cost = expected TTFT + ``interferenceWeight`` · decoding requests · own
    prefill ms (``T`` = ``maxLatencyMs``). Without expected TTFTs it scores the token load exactly as
    ``token-load-scorer`` does (in-flight uncached prefill + the request's own uncached prompt).

    The interference term is what the request's prefill costs the others: every decode stream running on
    the pod waits for the prefill chunks in its steps, so a pod's cost grows with the streams it would
    stall. 1 counts a millisecond of someone else's stall as much as one of this request's first token (the
    least total latency); 0 routes by this request's TTFT alone.
    """

    type_name = "expected-latency-scorer"
    Params = ExpectedLatencyScorerParams
    params: ExpectedLatencyScorerParams
    consumes = (
        EXPECTED_TTFT_MS,
        INFLIGHT_PREFILL_TOKENS,
        PREFIX_MATCH_BLOCKS,
        PREFIX_TOTAL_BLOCKS,
        PREFIX_BLOCK_SIZE_TOKENS,
    )

    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        expected = candidates.attrs.get(EXPECTED_TTFT_MS)
        if expected is None:
            load = uncached_prompt_tokens(request, candidates)
            inflight = candidates.attrs.get(INFLIGHT_PREFILL_TOKENS)
            if inflight is not None:
                load = load + inflight
            threshold = float(DEFAULT_QUEUE_THRESHOLD_TOKENS)
            return 1.0 - np.clip(load, 0.0, threshold) / threshold
        cycle.route = Route.EXPLORE if cycle.get(EXPLORED_KEY) else Route.PREDICTED
        cost = expected
        weight = self.params.interference_weight
        if weight > 0:
            decoding = candidates.column("inflight_decoding")
            cost = expected + weight * decoding * candidates.attrs[OWN_PREFILL_MS]
        cap = self.params.max_latency_ms
        return 1.0 - np.clip(cost, 0.0, cap) / cap
