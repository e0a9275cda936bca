"""Sidecar mode's ``LatencyPredictorBackend``: predictions from prediction servers, samples to the training
server."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from slorouter.predictor.backend import PredictionUnavailable
from slorouter.predictor.features import ModelKind
from slorouter.predictor.prediction_client import PredictionClient
from slorouter.predictor.sample_sink import TrainingSampleSink


class RemotePredictor:
    """Predictions over HTTP (``PredictionClient``), samples buffered and posted (``TrainingSampleSink``)."""

    synchronous = False  # every answer needs a round trip: callers await ``predict``

    def __init__(self, client: PredictionClient, sink: TrainingSampleSink) -> None:
        self.client = client
        self.sink = sink
        client.published_versions = lambda: sink.published_versions

    @classmethod
    def from_urls(
        cls,
        prediction_urls: Sequence[str],
        training_url: str,
        *,
        registry: CollectorRegistry | None = None,
        **client_options: Any,
    ) -> RemotePredictor:
        return cls(
            PredictionClient(prediction_urls, registry=registry, **client_options),
            TrainingSampleSink(training_url, registry=registry),
        )

    @property
    def ready(self) -> bool:
        return self.client.ready

    @property
    def versions(self) -> dict[str, str | None]:
        """The versions the training server publishes (as of its last answer to the samples); each
        prediction server's own are in ``stale_servers`` when they differ for long."""
        return dict(self.sink.published_versions)

    @property
    def stale_servers(self) -> dict[str, dict[str, str]]:
        """The prediction servers that serve other versions than the published ones for too long, with
        the versions they serve."""
        return {server.url: dict(server.versions) for server in self.client.servers if server.stale}

    def point_factor(self, kind: ModelKind) -> float:
        return math.nan  # the prediction servers answer the served quantile only

    def retrain_soon(self, kind: ModelKind) -> None:
        self.sink.request_retrain(kind)

    @property
    def warm_start_report(self) -> None:
        return None  # the training server's own, in its /v1/status

    def start(self) -> None:
        self.client.start()
        self.sink.start()

    async def stop(self) -> None:
        await self.client.stop()
        await self.sink.stop()

    def predict_now(self, x_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise PredictionUnavailable("a remote predictor answers only through the awaited predict()")

    async def predict(self, x_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return await self.client.predict(x_all)

    def add_sample(self, kind: ModelKind, row: Mapping[str, float] | np.ndarray, latency_ms: float) -> None:
        self.sink.add(kind, row, latency_ms)
