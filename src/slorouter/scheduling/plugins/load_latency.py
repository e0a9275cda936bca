"""Expected TTFT from the router's own load counters, learned online from the pool's first tokens.

``load-latency-producer`` turns llm-d's token-aware load core into milliseconds. For each candidate it takes
the uncached prefill tokens in flight ahead of the request there (``q``), the request's own uncached prompt
there (``o``; both are what ``token-load-scorer`` adds up) and the decode context running there (``d``, the
context tokens of the requests past their first token), and estimates

    TTFT ≈ speed[pod] · (θ₀ + θ₁·q + θ₂·o + θ₃·d + θ₄·(q + o)·d + θ₅·o² + θ₆·r)

- θ is one fit for the whole pool (``LoadLatencyFit``): relative-error least squares over the recent first
  tokens, constrained to θ ≥ 0. Why this shape: a vLLM-like engine drains prefill work at a rate set by its
  step time; the running decodes ride in every step and slow it; a long prompt's attention over itself
  grows with its square; requests waiting for their first token (``r``) also queue for batch slots and
  KV-cache admission, which costs time even when their prompts are cached. The queue and the own prompt
  have separate rates because the router counts a
  queued prompt in full until its first token, when part of it is usually done. A linear form keeps the
  ranking monotone in the work (the token-aware core is never overridden by noise) and extrapolates to
  loads the fit has not seen, which a tree ensemble does not.
- ``speed[pod]`` is what counting tokens cannot see: how much slower or faster this pod runs than the
  pool's typical pod, from its own recent first tokens (``LoadLatencyFit``). A pod 2.2× slower than the rest
  learns it within tens of requests; on a homogeneous pool every speed stays near 1.

The producer also attaches what the request's own prompt adds there (the terms in ``o``): the time the
decode streams running on that pod would stall behind its prefill, which ``expected-latency-scorer``
charges for (``interferenceWeight``).

Everything it reads is router-local (in-flight counters, prefix match), so late or coarse engine metrics do
not touch it. Until the fit has ``minSamples`` first tokens (or while it has no cost per own-prompt token)
it attaches nothing, and the scorer counts tokens as ``token-load-scorer`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field
from scipy.optimize import nnls

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
from slorouter.scheduling.plugins.inflight import token_load_scores, uncached_prompt_tokens
from slorouter.scheduling.plugins.latency import EXPLORED_KEY
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, CycleState, InferenceRequest, Route, SchedulingResult

# Feature scales: they keep the normal equations well conditioned (w in thousands of tokens, d in 100k).
WORK_SCALE = 1e-3
DECODE_SCALE = 1e-5
N_TERMS = 7  # 1, q, o, d, (q + o)·d, o², r
MAX_LOG_RATIO = math.log(20.0)  # observations 20× off the fit (aborts, clock glitches) teach nothing
RESOLVE_EVERY = 32  # samples between solves of the pooled fit, once it has 2 × minSamples


def load_terms(
    queue_tokens: np.ndarray,
    own_tokens: np.ndarray,
    decode_tokens: np.ndarray,
    waiting_requests: np.ndarray | None = None,
) -> np.ndarray:
    """The fit's regressors, one row per candidate: 1, q, o, d, (q + o)·d, o², r (scaled); q: uncached
    prefill tokens in flight ahead of the request, o: its own uncached prompt, d: the decode context running
    there, r: requests in flight there that have not had their first token. o² is the attention of a long
    prompt over itself; r is the queueing that is not prefill work (batch slots, KV-cache admission): cached
    prompts wait there too, at almost no uncached tokens."""
    q = np.asarray(queue_tokens, dtype=np.float64) * WORK_SCALE
    o = np.asarray(own_tokens, dtype=np.float64) * WORK_SCALE
    d = np.asarray(decode_tokens, dtype=np.float64) * DECODE_SCALE
    r = np.zeros(len(q)) if waiting_requests is None else np.asarray(waiting_requests, dtype=np.float64)
    return np.column_stack((np.ones(len(q)), q, o, d, (q + o) * d, o * o, r))


class LoadLatencyFit:
    """TTFT ≈ speed[pod] · θ·x, fitted online (see the module docstring).

    θ: exponentially weighted (``half_life_samples``), relative-error (1/TTFT²) weighted least squares over
    every pod's first tokens, constrained to θ ≥ 0 (each term can only add latency; unconstrained, the
    collinear terms that the router's own routing produces take opposite signs). ``ridge``, relative to the
    data's scale, matters only in directions without samples.

    speed: a pod's recency-weighted mean log(observed / θ·x), shrunk by n/(n + ``speed_prior_samples``) and
    taken relative to the pool's mean, so the pool's typical pod has speed 1 and θ keeps its meaning. Its
    samples fade with the *pool's* observations (half-life ``speed_half_life_samples`` per pod), so a pod
    that gets no traffic drifts back to the pool's speed and is tried again, instead of being starved on an
    old unlucky estimate.
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
        self._speed_half_life = speed_half_life_samples
        self._prior = speed_prior_samples
        self.min_samples = min_samples
        self._ridge = ridge
        self._gram = np.zeros((N_TERMS, N_TERMS))
        self._moment = np.zeros(N_TERMS)
        self._theta: np.ndarray | None = None
        self._dirty = False
        self._solved_at = 0
        self.samples = 0
        self._tick = 0  # observations with a usable fit, of every pod
        # pod -> [Σ log ratio, count], both decayed to the tick in the third slot
        self._log_speed: dict[str, list[float]] = {}
        self._relative: dict[str, float] | None = None  # pod -> speed, until the next observation

    # --- speeds ---------------------------------------------------------------------------------------
    def _pool_decay(self) -> float:
        return 0.5 ** (1.0 / (self._speed_half_life * max(len(self._log_speed), 1)))

    def _decayed(self, stats: list[float], decay: float) -> tuple[float, float]:
        factor = decay ** (self._tick - stats[2])
        return stats[0] * factor, stats[1] * factor

    def _speeds(self) -> dict[str, float]:
        relative = self._relative
        if relative is None:
            decay = self._pool_decay()
            shrunk: dict[str, tuple[float, float]] = {}
            for pod, stats in self._log_speed.items():
                total, count = self._decayed(stats, decay)
                shrunk[pod] = (total / (count + self._prior), count)
            weight = sum(count for _, count in shrunk.values())
            anchor = sum(m * count for m, count in shrunk.values()) / weight if weight > 0 else 0.0
            relative = {pod: math.exp(m - anchor) for pod, (m, _) in shrunk.items()}
            self._relative = relative
        return relative

    def speed(self, pod: str) -> float:
        """This pod's latency relative to the pool's typical pod (1 for a pod without samples)."""
        return self._speeds().get(pod, 1.0)

    def speeds(self, pods: list[str]) -> np.ndarray:
        relative = self._speeds()
        return np.array([relative.get(p, 1.0) for p in pods])

    # --- pooled fit -----------------------------------------------------------------------------------
    @property
    def theta(self) -> np.ndarray | None:
        """The pooled coefficients, or None while the fit is not usable (too few samples, or no load term with
        a cost: the latency does not depend on anything the router counts)."""
        if self.samples < self.min_samples:
            return None
        # Re-solved every few samples: one sample moves a fit over thousands very little, and the solve
        # (a Cholesky factor and a small NNLS) is the producer's largest cost.
        young = self.samples < 2 * self.min_samples
        if self._dirty and (young or self._theta is None or self.samples - self._solved_at >= RESOLVE_EVERY):
            self._theta = self._solve()
            self._dirty = False
            self._solved_at = self.samples
        theta = self._theta
        if theta is None or not np.isfinite(theta).all() or not theta[1:].any():
            return None
        return theta

    def _solve(self) -> np.ndarray | None:
        scale = np.trace(self._gram) / N_TERMS
        if not scale > 0:
            return None
        regularised = self._gram + (self._ridge * scale) * np.eye(N_TERMS)
        try:
            upper = np.linalg.cholesky(regularised).T  # regularised = upperᵀ · upper
        except np.linalg.LinAlgError:
            return None
        # min θᵀGθ − 2 bᵀθ over θ ≥ 0  ⇔  min ‖upper·θ − upper⁻ᵀ b‖² over θ ≥ 0
        target = np.linalg.solve(upper.T, self._moment)
        theta, _ = nnls(upper, target)
        return np.asarray(theta, dtype=np.float64)

    def expected_ms(self, terms: np.ndarray, pods: list[str]) -> np.ndarray | None:
        theta = self.theta
        if theta is None:
            return None
        return (terms @ theta) * self.speeds(pods)

    def observe(self, pod: str, terms: np.ndarray, ttft_ms: float) -> None:
        """One first token: ``terms`` as ``load_terms`` built them for this pod at dispatch."""
        if not (ttft_ms > 0 and math.isfinite(ttft_ms)):
            return
        theta = self.theta
        scale = ttft_ms
        if theta is not None:
            pooled = float(terms @ theta)
            if pooled > 0:
                log_ratio = math.log(ttft_ms / pooled)
                if abs(log_ratio) <= MAX_LOG_RATIO:
                    scale = pooled * self.speed(pod)
                    self._observe_speed(pod, log_ratio)
        # Weighted by 1/TTFT² (the fitted one once there is a fit, which is not biased low as 1/observed²
        # is): the fit minimises relative error, so a 30 ms chat turn counts as much as a 3 s long prompt
        # (plain least squares would fit the long prompts and ignore the rest).
        weight = 1.0 / (scale * scale)
        self._gram *= self._decay
        self._moment *= self._decay
        self._gram += weight * np.outer(terms, terms)
        self._moment += (weight * ttft_ms) * terms
        self._dirty = True
        self.samples += 1

    def _observe_speed(self, pod: str, log_ratio: float) -> None:
        stats = self._log_speed.get(pod)
        if stats is None:
            stats = self._log_speed[pod] = [0.0, 0.0, float(self._tick)]
        self._tick += 1
        total, count = self._decayed(stats, self._pool_decay())
        stats[:] = [total + log_ratio, count + 1.0, float(self._tick)]
        self._relative = None

    def forget(self, pod: str) -> None:
        self._log_speed.pop(pod, None)
        self._relative = None


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
        decode = candidates.column("inflight_decode_tokens")
        waiting = candidates.column("inflight_requests") - candidates.column("inflight_decoding")
        terms = load_terms(candidates.column("inflight_prefill_tokens"), own, decode, waiting)
        pods = [e.address for e in candidates.endpoints]
        request.state[self.name] = _Dispatch(pods, terms)
        theta = self.fit.theta
        if theta is None:
            return
        speeds = self.fit.speeds(pods)
        candidates.attrs[EXPECTED_TTFT_MS] = (terms @ theta) * speeds
        # What the request's own prompt adds to the pod's work: the terms in o.
        o = own * WORK_SCALE
        per_own_token = theta[2] + theta[4] * (decode * DECODE_SCALE) + theta[5] * o
        candidates.attrs[OWN_PREFILL_MS] = per_own_token * o * speeds

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
            return token_load_scores(request, candidates, candidates.attrs.get(INFLIGHT_PREFILL_TOKENS))
        cycle.route = Route.EXPLORE if cycle.get(EXPLORED_KEY) else Route.PREDICTED
        cost = expected
        weight = self.params.interference_weight
        if weight > 0:
            decoding = candidates.column("inflight_decoding")
            cost = expected + weight * decoding * candidates.attrs[OWN_PREFILL_MS]
        cap = self.params.max_latency_ms
        return 1.0 - np.clip(cost, 0.0, cap) / cap
