"""A finished request's outcome in the front-end metrics: its count by endpoint and status, the TTFT and
TPOT histograms the predictor's series compare against, the status page's per-request figures
(``slorouter.serving.status``) and, with ``--record``, the traffic recording
(``slorouter.serving.recording``). Both front-ends record through this one place."""

from __future__ import annotations

from slorouter.director import RequestLifecycle
from slorouter.metrics import GatewayMetrics
from slorouter.serving.recording import TrafficRecorder
from slorouter.serving.status import RouterStats


class OutcomeRecorder:
    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        e2e_as_ttft: bool,
        stats: RouterStats | None = None,
        traffic: TrafficRecorder | None = None,
    ) -> None:
        self._metrics = metrics
        # With streamingMode false the predictor models E2E latency, and the TTFT histograms hold E2E
        # latency, as in the original, so that actual and predicted series compare like with like.
        self._e2e_as_ttft = e2e_as_ttft
        self._stats = stats
        self.traffic = traffic

    def record(self, lifecycle: RequestLifecycle, path: str, body: bytes | None = None) -> None:
        """Count the answered request; observe TTFT (and TPOT when streamed) when it succeeded. ``path``:
        the inference route it came on; ``body``: the whole response body, when the front-end read it."""
        if self.traffic is not None:
            self.traffic.answered(lifecycle, path, body)
        response = lifecycle.response
        request = lifecycle.request
        address = response.endpoint.address
        self._metrics.count_request(address, response.status)
        ttft_s = tpot_s = None
        if response.status == 200 and response.succeeded and response.first_token_at is not None:
            ttft, tpot = self._metrics.latency_children(request.model, request.target_model)
            end = (
                response.completed_at
                if self._e2e_as_ttft and response.completed_at
                else response.first_token_at
            )
            ttft_s = end - request.received_at
            ttft.observe(ttft_s)
            if response.streaming and response.tokens > 1 and response.completed_at is not None:
                tpot_s = (response.completed_at - response.first_token_at) / (response.tokens - 1)
                tpot.observe(tpot_s)
        if self._stats is None:
            return
        slo_met = None
        if request.has_slo:
            slo_met = ttft_s is not None
            if slo_met and request.slo_ttft_ms is not None:
                slo_met = ttft_s is not None and ttft_s * 1000 <= request.slo_ttft_ms
            if slo_met and request.slo_tpot_ms is not None and tpot_s is not None:
                slo_met = tpot_s * 1000 <= request.slo_tpot_ms
        prediction = lifecycle.prediction
        self._stats.record(
            address,
            lifecycle.route.value,
            predicted_ttft_ms=prediction.ttft_ms if prediction is not None else None,
            observed_ttft_ms=None if ttft_s is None else ttft_s * 1000,
            slo_met=slo_met,
        )
