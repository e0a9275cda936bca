"""Each pod's two speeds relative to the pool's typical pod (fixed costs, prompt work), learned from its
own first tokens and shrunk towards the pool as far as the pods' spread is noise."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# A pod's speeds are learned only from first tokens that did not queue (at most this many requests ahead of
# it still waiting for their first token, no wait for a batch slot): where requests queue, what the pooled
# fit misses grows with the queue, and a pod that happens to be the most loaded would take that misfit for
# slowness (then be sent less, drain, and look fast again); on 8 equal pods near saturation that swing cost
# TTFT p90 (maas-mix at 170 QPS, seed 0: 2,919 ms against 1,620 without speeds).
SPEED_MAX_WAITING = 2.0
MIN_FACTOR, MAX_FACTOR = 0.05, 20.0
SPEED_RATIO_CLIP = 2.0
MIN_SPEED_NOISE = 0.05  # the least scatter of a pod's ratios assumed (a few noise-free samples prove little)


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
