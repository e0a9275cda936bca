"""A finished request's outcome in the front-end metrics: its count by endpoint and status, and the TTFT and
TPOT histograms the predictor's series compare against. Both front-ends record through this one place."""

from __future__ import annotations

from slorouter.director import RequestLifecycle
from slorouter.metrics import GatewayMetrics


class OutcomeRecorder:
    def __init__(self, metrics: GatewayMetrics, *, e2e_as_ttft: bool) -> None:
        self._metrics = metrics
        # With streamingMode false the predictor models E2E latency, and the TTFT histograms hold E2E
        # latency, as in the original, so that actual and predicted series compare like with like.
        self._e2e_as_ttft = e2e_as_ttft

    def record(self, lifecycle: RequestLifecycle) -> None:
        """Count the answered request; observe TTFT (and TPOT when streamed) when it succeeded."""
        response = lifecycle.response
        request = lifecycle.request
        self._metrics.count_request(response.endpoint.address, response.status)
        if response.status != 200 or response.error or response.first_token_at is None:
            return
        ttft, tpot = self._metrics.latency_children(request.model, request.target_model)
        end = (
            response.completed_at if self._e2e_as_ttft and response.completed_at else response.first_token_at
        )
        ttft.observe(end - request.received_at)
        if response.streaming and response.tokens > 1 and response.completed_at is not None:
            tpot.observe((response.completed_at - response.first_token_at) / (response.tokens - 1))
