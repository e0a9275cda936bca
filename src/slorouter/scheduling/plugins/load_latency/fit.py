"""The pooled online fit of expected TTFT over the load terms, with each pod's speeds."""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import nnls

from slorouter.scheduling.plugins.load_latency.speeds import SPEED_MAX_WAITING, PodSpeeds
from slorouter.scheduling.plugins.load_latency.terms import (
    N_TERMS,
    SLOT_TERM,
    WAITING_TERM,
    split_expectation,
)

MAX_LOG_RATIO = math.log(20.0)  # observations 20× off the fit (aborts, clock glitches) teach nothing
RESOLVE_EVERY = 32  # samples between solves of the pooled fit, once it has 2 × minSamples


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
