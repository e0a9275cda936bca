"""Expected TTFT from the router's own load counters, learned online from the pool's first tokens.

``load-latency-producer`` turns llm-d's token-aware load core into milliseconds. For each candidate it takes
the uncached prefill tokens in flight ahead of the request there (``q``), the request's own uncached prompt
there (``o``; both are what ``token-load-scorer`` adds up) and the decode context running there (``d``, the
context tokens of the requests past their first token), and estimates

    TTFT ≈ a[pod]·(θ₀ + θ₃·d + θ₆·r) + b[pod]·(θ₁·q + θ₂·o + θ₄·(q + o)·d + θ₅·o²) + θ₇·s

- θ is one fit for the whole pool (``LoadLatencyFit``): relative-error least squares over the recent first
  tokens, constrained to θ ≥ 0. Why this shape: a vLLM-like engine drains prefill work at a rate set by its
  step time; the running decodes ride in every step and slow it; a long prompt's attention over itself
  grows with its square; requests waiting for their first token (``r``) also queue for batch slots and
  KV-cache admission, which costs time even when their prompts are cached. The queue and the own prompt
  have separate rates because the router counts a
  queued prompt in full until its first token, when part of it is usually done. ``s`` is the wait for a
  batch slot (``BatchSlotQueue``): a pod at its cap of running requests (``max_num_seqs``, or what its KV
  cache admits) starts a new one only when one finishes, so a request ``k`` places beyond the cap waits about
  ``k`` × service time / cap (Little's law); no token count sees that, and a per-request slope fitted over
  the many short waits of a pod below its cap puts about a millisecond on it. A linear form keeps the
  ranking monotone in the work (the token-aware core is never overridden by noise) and extrapolates to
  loads the fit has not seen, which a tree ensemble does not.
- ``a[pod]``, ``b[pod]`` are what counting tokens cannot see: how much slower or faster this pod runs its
  fixed costs and its prompt work than the pool's typical pod, from its own recent first tokens
  (``PodSpeeds``). A pod 2.2× slower than the rest learns it within tens of requests; on a homogeneous pool
  every speed stays near 1. Everything it reads is router-local (in-flight counters, prefix match) but for
  the batch-slot cap, which only the pod's scraped queue tells; late or coarse engine metrics delay that,
  nothing else.

The producer also attaches what the request's own prompt adds there (the terms in ``o``): the time the
decode streams running on that pod would stall behind its prefill, which ``expected-latency-scorer``
charges for (``interferenceWeight``); and each pod's recent decode pace (``DecodePace``: milliseconds per
output token of its recent streams), which the scorer charges for the request's own tokens
(``decodeWeight``): the first token is not the whole wait of a request that streams a long reply.

Until the fit has ``minSamples`` first tokens (or while it has no cost per own-prompt token)
it attaches nothing, and the scorer counts tokens as ``token-load-scorer`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field
from scipy.optimize import nnls

from slorouter.scheduling.datakeys import (
    DECODE_PACE_MS,
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
SLOT_WAIT_SCALE = 1e-3  # s in seconds
N_TERMS = 8  # 1, q, o, d, (q + o)·d, o², r, s
MAX_LOG_RATIO = math.log(20.0)  # observations 20× off the fit (aborts, clock glitches) teach nothing
RESOLVE_EVERY = 32  # samples between solves of the pooled fit, once it has 2 × minSamples
PRUNE_EVERY = 1024  # schedulings between drops of the per-pod state of pods no longer in the pool


def load_terms(
    queue_tokens: np.ndarray,
    own_tokens: np.ndarray,
    decode_tokens: np.ndarray,
    waiting_requests: np.ndarray | None = None,
    slot_wait_ms: np.ndarray | None = None,
) -> np.ndarray:
    """The fit's regressors, one row per candidate: 1, q, o, d, (q + o)·d, o², r, s (scaled); q: uncached
    prefill tokens in flight ahead of the request, o: its own uncached prompt, d: the decode context running
    there, r: requests in flight there that have not had their first token, s: the expected wait for a batch
    slot (``BatchSlotQueue``). o² is the attention of a long prompt over itself; r is the queueing that is
    not prefill work (KV-cache admission): cached prompts wait there too, at almost no uncached tokens."""
    q = np.asarray(queue_tokens, dtype=np.float64) * WORK_SCALE
    o = np.asarray(own_tokens, dtype=np.float64) * WORK_SCALE
    d = np.asarray(decode_tokens, dtype=np.float64) * DECODE_SCALE
    zeros = np.zeros(len(q))
    r = zeros if waiting_requests is None else np.asarray(waiting_requests, dtype=np.float64)
    s = zeros if slot_wait_ms is None else np.asarray(slot_wait_ms, dtype=np.float64) * SLOT_WAIT_SCALE
    return np.column_stack((np.ones(len(q)), q, o, d, (q + o) * d, o * o, r, s))


class BatchSlotQueue:
    """Per pod: how many requests it runs at once at most, and how long a request takes there, so the wait
    of a request beyond that cap can be estimated: places beyond the cap × service time / cap.

    The cap is learned from the pod's scraped metrics: when it reports requests waiting, the requests it runs
    are as many as it can (its ``max_num_seqs``, or what its KV cache admits then). A pod never seen
    waiting has no known cap and no slot wait. The service time is a moving mean of its requests' dispatch
    to end of stream."""

    def __init__(self, *, service_alpha: float = 0.05) -> None:
        self._alpha = service_alpha
        self._cap: dict[str, float] = {}
        self._service_ms: dict[str, float] = {}

    def learn_caps(self, pods: list[str], waiting: np.ndarray, running: np.ndarray) -> None:
        for i in np.flatnonzero((waiting > 0) & (running > 0)).tolist():
            pod = pods[i]
            seen = float(running[i])
            if seen > self._cap.get(pod, 0.0):
                self._cap[pod] = seen

    def observe_service(self, pod: str, service_ms: float) -> None:
        if not (service_ms > 0 and math.isfinite(service_ms)):
            return
        mean = self._service_ms.get(pod)
        self._service_ms[pod] = service_ms if mean is None else mean + self._alpha * (service_ms - mean)

    def pods(self) -> set[str]:
        return self._cap.keys() | self._service_ms.keys()

    def forget(self, pod: str) -> None:
        self._cap.pop(pod, None)
        self._service_ms.pop(pod, None)

    def wait_ms(self, pods: list[str], inflight_requests: np.ndarray) -> np.ndarray:
        """Expected wait for a slot of a request sent now to each pod (0 where the cap or time is unknown)."""
        cap = np.array([self._cap.get(p, math.inf) for p in pods])
        service = np.array([self._service_ms.get(p, 0.0) for p in pods])
        beyond = np.maximum(np.asarray(inflight_requests, dtype=np.float64) + 1.0 - cap, 0.0)
        return beyond * service / cap


# Which of the regressors are the pod's fixed costs (the step's floor, the decode context read in every
# step, the requests queued for admission) and which are prompt work (prefill compute): a pod of another GPU
# class differs in the two by other factors (an A100 runs the weight reads 1.6× slower than an H100 and the
# prefill compute 3.2×), so each pod gets two speeds. The slot wait is already the pod's own.
FIXED_TERMS = np.array([0, 3, 6])
WORK_TERMS = np.array([1, 2, 4, 5])
SLOT_TERM = 7
WAITING_TERM = 6
# A pod's speeds are learned only from first tokens that did not queue (at most this many requests ahead of
# it still waiting for their first token, no wait for a batch slot): where requests queue, what the pooled
# fit misses grows with the queue, and a pod that happens to be the most loaded would take that misfit for
# slowness (then be sent less, drain, and look fast again); on 8 equal pods near saturation that swing cost
# TTFT p90 (maas-mix at 170 QPS, seed 0: 2,919 ms against 1,620 without speeds).
SPEED_MAX_WAITING = 2.0
MIN_FACTOR, MAX_FACTOR = 0.05, 20.0
SPEED_RATIO_CLIP = 2.0
MIN_SPEED_NOISE = 0.05  # the least scatter of a pod's ratios assumed (a few noise-free samples prove little)


def split_expectation(theta: np.ndarray, terms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pooled expectation θ·x of one row of terms (or of each row) in its three parts: fixed costs,
    prompt work, and the slot wait (the parts the pod's two speeds scale, and the part they do not)."""
    fixed = terms[..., FIXED_TERMS] @ theta[FIXED_TERMS]
    work = terms[..., WORK_TERMS] @ theta[WORK_TERMS]
    return fixed, work, theta[SLOT_TERM] * terms[..., SLOT_TERM]


def _believed(log_speed: np.ndarray, variance: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each pod's speed relative to the pool's sample-weighted geometric mean, shrunk towards it as far as the
    pods' spread is what noise alone would give (empirical Bayes: the spread beyond the pods' sampling
    variances is the real one, τ²; a pod's difference is kept in the share τ²/(τ² + its variance)). On a pool
    of equal pods τ² is about 0 and every speed stays near 1 (noise there only misroutes: 8 equal pods near
    saturation, maas-mix at 170 QPS, lost 1.2-1.3× TTFT p90 to learned speeds over 3 seeds); an A100 among
    H100s stands far out of the noise and keeps its speeds."""
    weight = counts.sum()
    if not weight > 0:
        return np.ones(len(log_speed))
    anchor = float(counts @ log_speed) / weight
    deviation = log_speed - anchor
    finite = np.isfinite(variance)
    noise = float(counts[finite] @ variance[finite]) / weight if finite.any() else 0.0
    real = max(float(counts @ (deviation * deviation)) / weight - noise, 0.0)
    share = np.where(finite, real / np.maximum(real + np.where(finite, variance, 0.0), 1e-12), 0.0)
    return np.exp(share * deviation)


@dataclass(slots=True)
class _SpeedSolution:
    """Every pod's solved speeds at one tick: ``solved`` rows as ``PodSpeeds._solve`` returns them, the
    speeds relative to the pool, and each pod's row (the relative arrays have one more slot, for pods
    without samples)."""

    index: dict[str, int]
    solved: np.ndarray
    relative_a: np.ndarray
    relative_b: np.ndarray


class PodSpeeds:
    """Each pod's two speeds: how much slower than the pool's typical pod it runs its fixed costs (``a``) and
    its prompt work (``b``), from its first tokens against the pooled fit.

    A first token with pooled fixed part ``F``, work part ``W`` and observed ``y`` (its slot wait removed) is
    the equation ``y/(F + W) = a·f + b·w`` with ``f = F/(F + W)``, ``w = 1 − f``; a pod's recent equations are
    solved in least squares, shrunk towards (1, 1) as n/(n + ``prior_samples``), and each speed is taken
    relative to the pool's sample-weighted geometric mean, so the pool's typical pod has speeds 1 and θ keeps
    its meaning, and believed only as far as it stands out of the noise (``_believed``). The samples fade
    with the *pool's* observations (half-life ``half_life_samples`` per pod),
    so a pod that gets no traffic drifts back to the pool's speeds and is tried again, instead of being
    starved on an old estimate. One factor for both would be wrong for a pod that is slow only in compute: it
    would be learned from the long prompts it was sent and applied to the short ones."""

    def __init__(self, *, half_life_samples: float = 64.0, prior_samples: float = 16.0) -> None:
        self._half_life = half_life_samples
        self._prior = prior_samples
        self._tick = 0
        # pod -> [Σf², Σfw, Σw², Σf·t, Σw·t, n, Σt², tick]: sums decayed to the tick in the last slot
        self._stats: dict[str, np.ndarray] = {}
        self._solution: _SpeedSolution | None = None  # every pod's, until the next observation

    def _decay(self) -> float:
        return 0.5 ** (1.0 / (self._half_life * max(len(self._stats), 1)))

    def observe(self, pod: str, fixed_share: float, ratio: float) -> None:
        stats = self._stats.get(pod)
        if stats is None:
            stats = self._stats[pod] = np.zeros(8)
            stats[7] = self._tick
        decay = self._decay()
        f, w = fixed_share, 1.0 - fixed_share
        if stats[5] > 0:
            # Winsorised in log space around the pod's own estimate: one first token that waited behind a
            # burst moves the speeds by at most what a ratio of ``SPEED_RATIO_CLIP`` would (least squares on
            # raw ratios let such samples swing a pod's speeds; on 8 equal pods near saturation, maas-mix at
            # 170 QPS, TTFT p90 went from 1,620 to 2,919 ms). The pool's solution, when it was made after
            # the last observation, holds the pod's estimate for this very tick.
            solution = self._solution
            i = solution.index.get(pod) if solution is not None else None
            own_row = (
                solution.solved[i]
                if solution is not None and i is not None
                else self._solve(stats[None, :], decay)[0]
            )
            log_a, log_b = own_row[:2]
            own = math.exp(log_a) * f + math.exp(log_b) * w
            ratio = min(max(ratio, own / SPEED_RATIO_CLIP), own * SPEED_RATIO_CLIP)
        self._tick += 1
        stats[:7] *= decay ** (self._tick - stats[7])
        stats[:7] += (f * f, f * w, w * w, f * ratio, w * ratio, 1.0, ratio * ratio)
        stats[7] = self._tick
        self._solution = None

    def _solve(self, stats: np.ndarray, decay: float) -> np.ndarray:
        """One row per row of ``stats`` (pods' sums): log a, log b, decayed count, sampling variance of
        log a, of log b. Vectorised over pods: every pod is re-solved whenever the speeds are read after an
        observation, since the common decay moves every pod's shrinkage and weight (solutions cached and
        re-solved every 32 observations mixed fresh and stale pods, and on 8 equal pods near saturation,
        maas-mix at 170 QPS, seeds 0-2, TTFT p90 went from 1,680 / 1,786 / 1,534 to 1,621 / 2,334 / 3,302
        ms)."""
        sums = stats[:, :7] * (decay ** (self._tick - stats[:, 7]))[:, None]
        g_ff, g_fw, g_ww, m_f, m_w, n, t_t = sums.T
        out = np.empty((len(stats), 5))
        out[:] = (0.0, 0.0, 0.0, math.inf, math.inf)
        seen = n > 0
        if not seen.any():
            return out
        g_ff, g_fw, g_ww, m_f, m_w, n, t_t = (column[seen] for column in (g_ff, g_fw, g_ww, m_f, m_w, n, t_t))
        a, b = self._shrunk(g_ff, g_fw, g_ww, m_f, m_w, self._prior / n)
        a = np.clip(a, MIN_FACTOR, MAX_FACTOR)
        b = np.clip(b, MIN_FACTOR, MAX_FACTOR)
        # The estimates' sampling variances (σ²·G⁻¹, by the delta method in log space): how far noise alone
        # moves them, which decides below how much of a pod's difference from the pool is believed.
        residual = t_t - 2 * (a * m_f + b * m_w) + a * a * g_ff + 2 * a * b * g_fw + b * b * g_ww
        sigma2 = np.maximum(residual / n, MIN_SPEED_NOISE**2)
        det = g_ff * g_ww - g_fw * g_fw + 1e-3 * n * (g_ff + g_ww)
        positive = det > 0
        safe_det = np.where(positive, det, 1.0)
        var_a = np.where(positive, sigma2 * (g_ww + 1e-3 * n) / safe_det / (a * a), math.inf)
        var_b = np.where(positive, sigma2 * (g_ff + 1e-3 * n) / safe_det / (b * b), math.inf)
        out[seen] = np.column_stack((np.log(a), np.log(b), n, var_a, var_b))
        return out

    @staticmethod
    def _shrunk(
        g_ff: np.ndarray, g_fw: np.ndarray, g_ww: np.ndarray, m_f: np.ndarray, m_w: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        # ((1 + c)·G + εI)·x = m + c·G·1 + ε·1, c = prior / n: the unshrunk solution G⁻¹m pulled towards
        # (1, 1) as n/(n + prior) in every direction the pod's samples explore, and held at 1 (ε) in the
        # direction they do not (a pod sent only short prompts has no evidence about its prompt work).
        eps = 1e-3 * (g_ff + g_ww)
        a11, a12, a22 = (1 + c) * g_ff + eps, (1 + c) * g_fw, (1 + c) * g_ww + eps
        r1, r2 = m_f + c * (g_ff + g_fw) + eps, m_w + c * (g_fw + g_ww) + eps
        det = a11 * a22 - a12 * a12
        solvable = det > 0
        safe_det = np.where(solvable, det, 1.0)
        a = np.where(solvable, (r1 * a22 - a12 * r2) / safe_det, 1.0)
        b = np.where(solvable, (a11 * r2 - a12 * r1) / safe_det, 1.0)
        return a, b

    def _speeds(self) -> _SpeedSolution:
        solution = self._solution
        if solution is None:
            pods = list(self._stats)
            solved = self._solve(
                np.array([self._stats[p] for p in pods]).reshape(len(pods), 8), self._decay()
            )
            counts = solved[:, 2]
            # One extra slot at the end holds the speeds of a pod without samples, for index −1.
            relative_a = np.append(_believed(solved[:, 0], solved[:, 3], counts), 1.0)
            relative_b = np.append(_believed(solved[:, 1], solved[:, 4], counts), 1.0)
            index = {p: i for i, p in enumerate(pods)}
            solution = self._solution = _SpeedSolution(index, solved, relative_a, relative_b)
        return solution

    def of(self, pod: str) -> tuple[float, float]:
        """(fixed-cost speed, prompt-work speed) of the pod; (1, 1) for a pod without samples."""
        solution = self._speeds()
        i = solution.index.get(pod, -1)
        return float(solution.relative_a[i]), float(solution.relative_b[i])

    def arrays(self, pods: list[str]) -> tuple[np.ndarray, np.ndarray]:
        solution = self._speeds()
        index = solution.index
        rows = np.array([index.get(p, -1) for p in pods], dtype=np.intp)
        return solution.relative_a[rows], solution.relative_b[rows]

    def pods(self) -> set[str]:
        return set(self._stats)

    def forget(self, pod: str) -> None:
        self._stats.pop(pod, None)
        self._solution = None


class LoadLatencyFit:
    """TTFT ≈ a[pod]·(fixed terms of θ·x) + b[pod]·(prompt-work terms of θ·x) + θ₇·s, fitted online (see the
    module docstring).

    θ: exponentially weighted (``half_life_samples``), relative-error (1/TTFT²) weighted least squares over
    every pod's first tokens, constrained to θ ≥ 0 (each term can only add latency; unconstrained, the
    collinear terms that the router's own routing produces take opposite signs). ``ridge``, relative to the
    data's scale, matters only in directions without samples. a, b: ``PodSpeeds``.
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
        self.speeds = PodSpeeds(half_life_samples=speed_half_life_samples, prior_samples=speed_prior_samples)
        self.min_samples = min_samples
        self._ridge = ridge
        self._gram = np.zeros((N_TERMS, N_TERMS))
        self._moment = np.zeros(N_TERMS)
        self._theta: np.ndarray | None = None
        self._dirty = False
        self._solved_at = 0
        self.samples = 0

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
        fixed_speed, work_speed = self.speeds.arrays(pods)
        return self.expected_with(theta, terms, fixed_speed, work_speed)

    @staticmethod
    def expected_with(
        theta: np.ndarray, terms: np.ndarray, fixed_speed: np.ndarray, work_speed: np.ndarray
    ) -> np.ndarray:
        fixed, work, slot = split_expectation(theta, terms)
        return fixed_speed * fixed + work_speed * work + slot

    def observe(self, pod: str, terms: np.ndarray, ttft_ms: float) -> None:
        """One first token: ``terms`` as ``load_terms`` built them for this pod at dispatch."""
        if not (ttft_ms > 0 and math.isfinite(ttft_ms)):
            return
        theta = self.theta
        scale = ttft_ms
        if theta is not None:
            fixed, work, slot = (float(part) for part in split_expectation(theta, terms))
            pooled = fixed + work
            own = ttft_ms - slot
            if pooled > 0 and own > 0:
                ratio = own / pooled
                if abs(math.log(ratio)) <= MAX_LOG_RATIO:
                    a, b = self.speeds.of(pod)
                    scale = a * fixed + b * work + slot
                    if terms[WAITING_TERM] <= SPEED_MAX_WAITING and terms[SLOT_TERM] == 0:
                        self.speeds.observe(pod, fixed / pooled, ratio)
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

    def forget(self, pod: str) -> None:
        self.speeds.forget(pod)


class DecodePace:
    """Per pod: a moving mean of the time per output token of its recent streams (end of stream − first
    token, over the tokens after the first), the pace at which a request sent there now would decode.

    It is what the pod's decode batches and its GPU class make of every token, measured rather than
    modelled: a pod twice as slow per step, or running twice the batch, shows twice the pace. It lags the
    pod's load by the streams in flight (a mean over ``half_life_streams`` finished streams), which is why
    the scorer charges only the difference from the fastest candidate, not the pace itself."""

    def __init__(self, *, half_life_streams: float = 8.0) -> None:
        self._alpha = 1.0 - 0.5 ** (1.0 / half_life_streams)
        self._pace_ms: dict[str, float] = {}

    def observe(self, pod: str, first_token_at: float, completed_at: float, tokens: int) -> None:
        """One finished stream of ``tokens`` output tokens (clock times in seconds); streams of one token,
        or whose clock went backwards, carry no pace."""
        if tokens < 2:
            return
        pace = (completed_at - first_token_at) * 1000.0 / (tokens - 1)
        if not (pace > 0 and math.isfinite(pace)):
            return
        mean = self._pace_ms.get(pod)
        self._pace_ms[pod] = pace if mean is None else mean + self._alpha * (pace - mean)

    def of(self, pods: list[str]) -> np.ndarray:
        """Each pod's pace (ms per token); NaN for a pod with no finished stream yet."""
        return np.array([self._pace_ms.get(p, math.nan) for p in pods])

    def pods(self) -> set[str]:
        return set(self._pace_ms)

    def forget(self, pod: str) -> None:
        self._pace_ms.pop(pod, None)


class LoadLatencyParams(PluginParams):
    half_life_samples: float = Field(2000.0, alias="halfLifeSamples", gt=0.0)
    speed_half_life_samples: float = Field(64.0, alias="speedHalfLifeSamples", gt=0.0)
    speed_prior_samples: float = Field(16.0, alias="speedPriorSamples", ge=0.0)
    min_samples: int = Field(50, alias="minSamples", ge=1)
    pace_half_life_streams: float = Field(8.0, alias="paceHalfLifeStreams", gt=0.0, allow_inf_nan=False)


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
    produces = (EXPECTED_TTFT_MS, OWN_PREFILL_MS, DECODE_PACE_MS)
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
        self.slots = BatchSlotQueue()
        self.pace = DecodePace(half_life_streams=p.pace_half_life_streams)
        self._until_prune = PRUNE_EVERY

    def forget_departed(self) -> None:
        """Drops the speeds and slot state of pods that left the pool (a pool whose pods come and go, as
        Kubernetes pods do with new addresses, would otherwise grow them without bound)."""
        pool = self.ctx.pool
        if pool is None:
            return
        known = self.fit.speeds.pods() | self.slots.pods() | self.pace.pods()
        for pod in known - {e.address for e in pool.endpoints}:
            self.fit.forget(pod)
            self.slots.forget(pod)
            self.pace.forget(pod)

    def produce(self, request: InferenceRequest, candidates: Candidates) -> None:
        self._until_prune -= 1
        if self._until_prune <= 0:
            self._until_prune = PRUNE_EVERY
            self.forget_departed()
        own = uncached_prompt_tokens(request, candidates)
        decode = candidates.column("inflight_decode_tokens")
        inflight = candidates.column("inflight_requests")
        waiting = inflight - candidates.column("inflight_decoding")
        pods = [e.address for e in candidates.endpoints]
        self.slots.learn_caps(pods, candidates.column("waiting"), candidates.column("running"))
        slot_wait = self.slots.wait_ms(pods, inflight)
        terms = load_terms(candidates.column("inflight_prefill_tokens"), own, decode, waiting, slot_wait)
        request.state[self.name] = _Dispatch(pods, terms)
        theta = self.fit.theta
        if theta is None:
            return
        fixed_speed, work_speed = self.fit.speeds.arrays(pods)
        candidates.attrs[EXPECTED_TTFT_MS] = self.fit.expected_with(theta, terms, fixed_speed, work_speed)
        # What the request's own prompt adds to the pod's work: the terms in o.
        o = own * WORK_SCALE
        per_own_token = theta[2] + theta[4] * (decode * DECODE_SCALE) + theta[5] * o
        candidates.attrs[OWN_PREFILL_MS] = per_own_token * o * work_speed
        candidates.attrs[DECODE_PACE_MS] = self.pace.of(pods)

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
        if dispatch is None or dispatch.target < 0 or response.first_token_at is None:
            return
        if response.error is not None or response.status not in (0, 200):
            return
        if end_of_stream and response.completed_at is not None:
            pod = dispatch.pods[dispatch.target]
            service_ms = (response.completed_at - response.dispatched_at) * 1000.0
            self.slots.observe_service(pod, service_ms)
            if response.streaming:
                self.pace.observe(pod, response.first_token_at, response.completed_at, response.tokens)
        if dispatch.observed:
            return
        dispatch.observed = True
        i = dispatch.target
        ttft_ms = (response.first_token_at - response.dispatched_at) * 1000.0
        self.fit.observe(dispatch.pods[i], dispatch.terms[i], ttft_ms)


class ExpectedLatencyScorerParams(PluginParams):
    max_latency_ms: float = Field(60_000.0, alias="maxLatencyMs", gt=0.0, allow_inf_nan=False)
    interference_weight: float = Field(0.0, alias="interferenceWeight", ge=0.0, allow_inf_nan=False)
    decode_weight: float = Field(0.0, alias="decodeWeight", ge=0.0, allow_inf_nan=False)
    max_decode_tokens: int = Field(1024, alias="maxDecodeTokens", ge=1)


@register_plugin
class ExpectedLatencyScorer(Plugin, Scorer):
    """``1 − min(cost, T)/T``, cost = expected TTFT + ``interferenceWeight`` · decoding requests · own
    prefill ms + ``decodeWeight`` · min(max_tokens, ``maxDecodeTokens``) · (pod's decode pace − the fastest
    candidate's) (``T`` = ``maxLatencyMs``). Without expected TTFTs it scores the token load exactly as
    ``token-load-scorer`` does (in-flight uncached prefill + the request's own uncached prompt).

    The interference term is what the request's prefill costs the others: every decode stream running on
    the pod waits for the prefill chunks in its steps, so a pod's cost grows with the streams it would
    stall. 1 counts a millisecond of someone else's stall as much as one of this request's first token (the
    least total latency); 0 routes by this request's TTFT alone.

    The decode term is what the request's own reply would cost there beyond the fastest candidate: its
    tokens (``max_tokens``, capped: a client's ceiling, not a length) times how much slower the pod has
    been decoding lately. It is the only term that sees a pod's decode batch and GPU class through its
    TPOT; without it the TTFT terms pile requests on the pods that answer first, whose batches then grow.
    Pods with no pace yet are charged nothing (so they are tried and measured).
    """

    type_name = "expected-latency-scorer"
    Params = ExpectedLatencyScorerParams
    params: ExpectedLatencyScorerParams
    consumes = (
        EXPECTED_TTFT_MS,
        DECODE_PACE_MS,
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
            cost = cost + weight * decoding * candidates.attrs[OWN_PREFILL_MS]
        if self.params.decode_weight > 0:
            cost = cost + self._decode_cost(request, candidates.attrs.get(DECODE_PACE_MS))
        cap = self.params.max_latency_ms
        return 1.0 - np.clip(cost, 0.0, cap) / cap

    def _decode_cost(self, request: InferenceRequest, pace: np.ndarray | None) -> np.ndarray | float:
        if pace is None:
            return 0.0
        known = np.isfinite(pace)
        if not known.any():
            return 0.0
        slower = np.where(known, pace - pace[known].min(), 0.0)
        tokens = min(request.max_tokens, self.params.max_decode_tokens)
        return (self.params.decode_weight * tokens) * slower
