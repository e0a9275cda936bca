"""What a discrete-event run records: each request's outcome and timings, and the run's facts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slorouter.scheduling.types import PickReason

# Request outcomes (``RunRecords.status``): HTTP-like codes, plus UNFINISHED for requests still running
# when the simulation stopped.
OK = 200
REJECTED = 400
SHED = 429
NO_ENDPOINT = 503
CANCELLED = 504  # the router cancelled it at its deadline (objectives' deadline.action cancel)
UNFINISHED = -1
PICK_REASONS: tuple[PickReason, ...] = tuple(PickReason)


@dataclass(slots=True)
class RunRecords:
    """Per-request outcomes of one run (arrays aligned with the workload's request list), and run facts."""

    arrival: np.ndarray
    status: np.ndarray  # OK, REJECTED, SHED, NO_ENDPOINT, CANCELLED or UNFINISHED
    pod: np.ndarray  # index of the pod that served it, -1 if none
    ttft_s: np.ndarray  # first token at the router − arrival; NaN if none
    e2e_s: np.ndarray  # end at the router − arrival; NaN if unfinished
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    output_tokens: np.ndarray
    slo_ttft_ms: np.ndarray  # NaN: no target
    slo_tpot_ms: np.ndarray
    predicted: np.ndarray  # routed with predictions (bool)
    predicted_ttft_ms: np.ndarray  # served (p90, corrected) TTFT prediction for the chosen pod; NaN if none
    point_ttft_ms: np.ndarray  # the point (median-like) prediction behind it
    predicted_tpot_ms: np.ndarray
    point_tpot_ms: np.ndarray
    pod_profiles: list[str]
    # Index of the picker that routed each request (all 0 with one picker; empty if not recorded).
    picker: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    # Seconds each request waited in flow control before its pick (0 without it; NaN if never picked).
    queued_s: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    # Routing regret at each pick (``slorouter.scheduling.regret``), in the router's view: the prompt tokens
    # the chosen pod held and the most any candidate held (-1: no record), the TTFT regret (NaN: none); and
    # in the pool's: the tokens the engines' prefix caches held at that instant (-1: never picked).
    achieved_prefix_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    reachable_prefix_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ttft_regret_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    true_achieved_prefix_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    true_reachable_prefix_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # The pick's reason, as its index in ``PICK_REASONS`` (-1: no record).
    pick_reason: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    virtual_s: float = 0.0
    wall_s: float = 0.0
    steps: int = 0
    events: int = 0
    trainings: int = 0
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def tpot_ms(self) -> np.ndarray:
        """(E2E − TTFT) / (output tokens − 1), NaN for single-token or unfinished requests."""
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = (self.e2e_s - self.ttft_s) * 1000.0 / (self.output_tokens - 1)
        return np.where(self.output_tokens > 1, tpot, np.nan)


def empty_column(n: int, value: float = math.nan) -> np.ndarray:
    return np.full(n, value, dtype=np.float64)
