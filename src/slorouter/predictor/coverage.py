"""Keeps the served quantile predictions at their nominal coverage in live traffic.

The models' p90 is calibrated offline, on held-out samples of the window they were trained on (the
split-conformal offset). Served to live traffic it covers less, most of all for TPOT: neighbouring samples
share a pod's state (one decode batch sets the TPOT of every stream in it), so residuals on samples from
the training window's own time are smaller than the residuals of predictions made for the next seconds,
and a request's TPOT also depends on routing still to come. Measured in virtual time (realtime-mix, 4
pods, 75 %): the served TPOT p90 covered 0.82 of the TPOTs, per-endpoint correction or not.

``CoverageTracker`` closes that loop with online quantile tracking (Angelopoulos, Candès and Tibshirani,
"Conformal PID control", 2023; the log-space form of Gibbs and Candès' adaptive conformal inference): per
model kind, a log-factor δ on every served prediction, moved after each outcome by

    δ ← δ + step · (miss − (1 − quantile)),   miss = 1 if actual > served else 0

so a miss raises the log-factor by step · quantile and a covered outcome lowers it by
step · (1 − quantile). The moves add up to step × (misses − T · (1 − quantile)) over T outcomes, so whatever
the shift between calibration and live traffic, while the models stay within the factor's bounds
(``max_log_factor``: 4× either way) of the truth the miss rate is within (max_log_factor + step) / (step · T)
of 1 − quantile. It needs no window and no model of the shift, and it is one float per kind.
"""

from __future__ import annotations

import math

from slorouter.predictor.features import MODEL_KINDS, ModelKind, check_kind


class CoverageTracker:
    """Per model kind, the factor that keeps ``actual ≤ served`` true for ``quantile`` of live outcomes."""

    def __init__(self, quantile: float = 0.9, *, step: float = 0.01, max_log_factor: float = math.log(4.0)):
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if not (step > 0.0 and math.isfinite(step)):
            raise ValueError(f"step must be a positive finite number, got {step}")
        if not (max_log_factor > 0.0 and math.isfinite(max_log_factor)):
            raise ValueError(f"max_log_factor must be a positive finite number, got {max_log_factor}")
        self.quantile = quantile
        self.step = step
        self.max_log_factor = max_log_factor
        self._log_factor = dict.fromkeys(MODEL_KINDS, 0.0)
        self.outcomes = dict.fromkeys(MODEL_KINDS, 0)
        self.misses = dict.fromkeys(MODEL_KINDS, 0)

    def factor(self, kind: ModelKind) -> float:
        """What to multiply this kind's predictions by before serving them."""
        return math.exp(self._log_factor[kind])

    def observe(self, kind: ModelKind, actual_ms: float, served_ms: float) -> bool:
        """One outcome against the prediction served for it (this tracker's factor included); False if
        either is not a positive finite number (the outcome then teaches nothing)."""
        check_kind(kind)
        if not (actual_ms > 0.0 and served_ms > 0.0 and math.isfinite(actual_ms * served_ms)):
            return False
        miss = actual_ms > served_ms
        self.outcomes[kind] += 1
        self.misses[kind] += miss
        moved = self._log_factor[kind] + self.step * (float(miss) - (1.0 - self.quantile))
        self._log_factor[kind] = min(max(moved, -self.max_log_factor), self.max_log_factor)
        return True
