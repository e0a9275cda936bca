"""The live check of a warm start: does a model learnt on the previous runs' samples predict this pool?

After a warm start, each model kind whose model or samples were taken over is *on probation* until
``LIVE_SAMPLES`` live samples arrived that its model was not trained on. Those are then scored with the
model's point prediction (the median-like one: exp of the margin for a log-latency model, the conformal
offset left out), and the model is kept when

    ratio = exp(median(log(point / observed)) + hold-out mean_log_ratio)

lies within [1 / ``MAX_FACTOR``, ``MAX_FACTOR``]: in the median, the model is off on the live samples by at
most a factor 2 (either way) more than on its own hold-out. The hold-out term is ≈ 0 for the default
``conformal`` and the ``mean`` objectives; for ``quantile`` it takes out the quantile's own distance from the
median.

Why a median ratio and not MAPE: what goes wrong with state of other runs is a scale error (other traffic,
other load, a slower pool of the same KV-cache shape), which the median measures whichever way it points and
however few requests run long; MAPE counts a 3× over-prediction as 2.0 but a 3× under-prediction as 0.67,
and single slow requests move it. Why 32 samples and a factor 2: for a model as good as on its hold-out,
the median of 32 log ratios has a standard error of about 1.25 σ / √32 ≈ 0.22 σ (σ the spread of its log
residuals, 0.2-0.5 for the point MAPE of about 0.18 measured on simulator traffic), so log 2 = 0.69 is over
six standard errors away and a good model is not dropped by chance; and 32 requests are seconds of traffic,
so a bad one gives way quickly. The MAPE is reported, not judged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

LIVE_SAMPLES = 32
MAX_FACTOR = 2.0

CheckState = Literal["pending", "kept", "dropped"]


@dataclass(frozen=True, slots=True)
class LiveScore:
    """A model's point predictions against observed latencies."""

    samples: int
    ratio: float  # median predicted / observed, relative to the model's hold-out (1: as on its hold-out)
    mape: float  # of the point predictions, for the record

    def within(self, max_factor: float) -> bool:
        return 1.0 / max_factor <= self.ratio <= max_factor


def score(observed_ms: np.ndarray, point_ms: np.ndarray, holdout_log_ratio: float = 0.0) -> LiveScore:
    """Score point predictions against observed latencies (both ms, > 0); ``holdout_log_ratio`` is the
    model's hold-out ``mean_log_ratio``, mean of log(observed / point)."""
    observed = np.asarray(observed_ms, dtype=np.float64)
    point = np.maximum(np.asarray(point_ms, dtype=np.float64), 1e-9)
    if observed.shape != point.shape or not len(observed):
        raise ValueError(f"{point.shape} predictions for {observed.shape} observed latencies")
    log_ratio = float(np.median(np.log(point / observed)))
    return LiveScore(
        samples=len(observed),
        ratio=math.exp(log_ratio + holdout_log_ratio),
        mape=float(np.mean(np.abs(observed - point) / observed)),
    )


@dataclass(frozen=True, slots=True)
class LiveCheck:
    """The live check of one model kind (``state`` ``pending`` until ``needed`` live samples arrived)."""

    state: CheckState
    needed: int  # live samples the verdict is taken on
    samples: int = 0  # live samples scored
    ratio: float | None = None  # LiveScore.ratio
    mape: float | None = None  # LiveScore.mape
    version: str | None = None  # the model scored

    def decided(self, score: LiveScore, version: str, max_factor: float) -> LiveCheck:
        """This check with ``score``'s verdict on model ``version``."""
        return LiveCheck(
            state="kept" if score.within(max_factor) else "dropped",
            needed=self.needed,
            samples=score.samples,
            ratio=score.ratio,
            mape=score.mape,
            version=version,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
