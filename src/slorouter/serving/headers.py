"""The response headers every front-end adds: which endpoint served the request, how it was picked, and
the prediction it was picked on."""

from __future__ import annotations

from slorouter.director import RequestLifecycle
from slorouter.flowcontrol.types import QUEUED_HEADER

ENDPOINT_HEADER = "x-slorouter-endpoint"
ROUTE_HEADER = "x-slorouter-route"
# With route fallback: why (warming-up, breaker-open, timeout, ...: docs/configuration.md).
FALLBACK_REASON_HEADER = "x-slorouter-fallback-reason"
PREDICTED_TTFT_HEADER = "x-slorouter-predicted-ttft-ms"
PREDICTED_TPOT_HEADER = "x-slorouter-predicted-tpot-ms"


def routing_response_headers(lifecycle: RequestLifecycle) -> list[tuple[str, str]]:
    headers = [(ENDPOINT_HEADER, lifecycle.target.address), (ROUTE_HEADER, str(lifecycle.route))]
    if lifecycle.admission.ticket is not None:
        headers.append((QUEUED_HEADER, f"{lifecycle.queued_s * 1000:.1f}"))
    reason = lifecycle.fallback_reason
    if reason is not None:
        headers.append((FALLBACK_REASON_HEADER, reason))
    predicted = lifecycle.prediction
    if predicted is not None:
        headers.append((PREDICTED_TTFT_HEADER, f"{predicted.ttft_ms:.1f}"))
        if predicted.tpot_ms is not None:
            headers.append((PREDICTED_TPOT_HEADER, f"{predicted.tpot_ms:.2f}"))
    return headers
