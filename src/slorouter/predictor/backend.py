"""What the router needs from the latency predictor, embedded or remote: the ``LatencyPredictorBackend``.

``EmbeddedPredictor`` (``slorouter.predictor.embedded``) answers in-process and declares itself
``synchronous``; ``RemotePredictor`` (``slorouter.predictor.remote``) asks prediction servers and must be
awaited. Both take the union feature matrix: one row per candidate, ``FeatureSchema.all_features()``
columns, as ``columns_to_union_matrix`` builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from slorouter.predictor.features import ModelKind

if TYPE_CHECKING:
    from slorouter.predictor.warm_start import WarmStartReport


class PredictionUnavailable(Exception):
    """No prediction in time (no model yet, timeout, no ready server, server errors): route by heuristics.

    ``reason`` names the cause in a word (the ``x-slorouter-fallback-reason`` header): ``PredictionClient``'s
    are ``breaker-open``, ``no-ready-server``, ``timeout``, ``unreachable``, ``server-error``, ``malformed``,
    ``rejected``, ``unauthorized`` and ``stopping``; other backends say ``unavailable``.
    """

    def __init__(self, message: str, reason: str = "unavailable") -> None:
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class LatencyPredictorBackend(Protocol):
    """The latency predictor as the router uses it."""

    @property
    def ready(self) -> bool:
        """True when predictions can be expected (a trained model is loaded / a server is ready)."""
        ...

    @property
    def synchronous(self) -> bool:
        """True when the backend answers in-process without waiting: ``predict_now`` is then valid."""
        ...

    @property
    def versions(self) -> Mapping[str, str | None]:
        """The model version served per kind (None before its first training); empty where the backend does
        not know them (the remote one: each prediction server reports its own in ``/v1/status``)."""
        ...

    @property
    def stale_servers(self) -> Mapping[str, Mapping[str, str]]:
        """Prediction servers serving other model versions than the training server publishes, for too
        long, with the versions they serve (empty for the embedded predictor, which has none)."""
        ...

    @property
    def warm_start_report(self) -> WarmStartReport | None:
        """What the start took over from the previous run, what it refused, and the live checks; None where
        the backend keeps no state (a temporary directory; the remote one: the training server reports its
        own in ``/v1/status``)."""
        ...

    def start(self) -> None:
        """Start background work; call with the event loop running."""
        ...

    async def stop(self) -> None: ...

    def predict_now(self, x_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predicted (TTFT ms, TPOT ms) per row of the union matrix, without the event loop (the hot path,
        and the discrete-event simulator, which has none). Only for a ``synchronous`` backend; raises
        ``PredictionUnavailable`` otherwise or when there is no prediction.

        TPOT is NaN while only a TTFT model exists (TPOT samples need finished requests, so it comes later).
        """
        ...

    async def predict(self, x_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``predict_now``'s answer for any backend; raises ``PredictionUnavailable`` when there is none."""
        ...

    def add_sample(self, kind: ModelKind, row: Mapping[str, float] | np.ndarray, latency_ms: float) -> None:
        """Record an observed latency with the features seen at scheduling time (``kind``'s columns)."""
        ...

    def point_factor(self, kind: ModelKind) -> float:
        """From ``kind``'s predictions to its point (median-like) predictions; NaN where the backend does not
        know it (the remote one)."""
        ...

    def retrain_soon(self, kind: ModelKind) -> None:
        """Train ``kind`` at the next chance, without waiting for its retrain interval (the prediction ledger
        saw it drift); the remote one asks the training server with its next batch of samples."""
        ...
