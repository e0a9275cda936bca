"""The facts of a pick every front-end reports, derived once: which endpoint serves the request, how it was
picked, why it went without predictions, what was predicted for it and how long it queued. The response
headers and the span attributes are two renderings of them."""

from __future__ import annotations

from dataclasses import dataclass

from slorouter.director import RequestLifecycle
from slorouter.flowcontrol.types import QUEUED_HEADER

ENDPOINT_HEADER = "x-slorouter-endpoint"
ROUTE_HEADER = "x-slorouter-route"
# With route fallback: why (warming-up, breaker-open, timeout, ...: docs/configuration.md).
FALLBACK_REASON_HEADER = "x-slorouter-fallback-reason"
PREDICTED_TTFT_HEADER = "x-slorouter-predicted-ttft-ms"
PREDICTED_TPOT_HEADER = "x-slorouter-predicted-tpot-ms"

_PREDICTED_TTFT = PREDICTED_TTFT_HEADER.encode()
_PREDICTED_TPOT = PREDICTED_TPOT_HEADER.encode()
_QUEUED = QUEUED_HEADER.encode()

AttributeDict = dict[str, str | bool | int | float]


@dataclass(slots=True)
class RoutingFacts:
    endpoint: str
    route: str
    fallback_reason: str | None = None
    predicted_ttft_ms: float | None = None
    predicted_tpot_ms: float | None = None
    queued_ms: float | None = None  # None: flow control did not hold it (or there is none)

    @classmethod
    def of(cls, lifecycle: RequestLifecycle) -> RoutingFacts:
        predicted = lifecycle.prediction
        return cls(
            lifecycle.target.address,
            str(lifecycle.route),
            lifecycle.fallback_reason,
            None if predicted is None else predicted.ttft_ms,
            None if predicted is None else predicted.tpot_ms,
            None if lifecycle.admission.ticket is None else lifecycle.queued_s * 1000,
        )

    def headers(self) -> list[tuple[str, str]]:
        """The routing response headers, in the order the front-ends send them."""
        headers = [(ENDPOINT_HEADER, self.endpoint), (ROUTE_HEADER, self.route)]
        if self.fallback_reason is not None:
            headers.append((FALLBACK_REASON_HEADER, self.fallback_reason))
        if self.predicted_ttft_ms is not None:
            headers.append((PREDICTED_TTFT_HEADER, f"{self.predicted_ttft_ms:.1f}"))
            if self.predicted_tpot_ms is not None:
                headers.append((PREDICTED_TPOT_HEADER, f"{self.predicted_tpot_ms:.2f}"))
        if self.queued_ms is not None:
            headers.append((QUEUED_HEADER, f"{self.queued_ms:.1f}"))
        return headers

    def head_lines(self, fixed: dict[tuple[str, str, str | None], bytes]) -> bytes:
        """``headers`` as preformatted HTTP/1.1 lines; ``fixed`` caches the lines that repeat across
        requests (endpoint, route, fallback reason), so the hot path formats only the numbers."""
        key = (self.endpoint, self.route, self.fallback_reason)
        lines = fixed.get(key)
        if lines is None:
            text = f"{ENDPOINT_HEADER}: {self.endpoint}\r\n{ROUTE_HEADER}: {self.route}\r\n"
            if self.fallback_reason is not None:
                text += f"{FALLBACK_REASON_HEADER}: {self.fallback_reason}\r\n"
            lines = fixed[key] = text.encode("latin-1")
        if self.predicted_ttft_ms is not None:
            lines += b"%s: %.1f\r\n" % (_PREDICTED_TTFT, self.predicted_ttft_ms)
            if self.predicted_tpot_ms is not None:
                lines += b"%s: %.2f\r\n" % (_PREDICTED_TPOT, self.predicted_tpot_ms)
        if self.queued_ms is not None:
            lines += b"%s: %.1f\r\n" % (_QUEUED, self.queued_ms)
        return lines

    def span_attributes(self) -> AttributeDict:
        """The pick as span attributes (``slorouter.tracing``)."""
        attributes: AttributeDict = {"slorouter.endpoint": self.endpoint, "slorouter.route": self.route}
        if self.fallback_reason is not None:
            attributes["slorouter.fallback_reason"] = self.fallback_reason
        if self.predicted_ttft_ms is not None:
            attributes["slorouter.predicted_ttft_ms"] = self.predicted_ttft_ms
            if self.predicted_tpot_ms is not None:
                attributes["slorouter.predicted_tpot_ms"] = self.predicted_tpot_ms
        if self.queued_ms is not None:
            attributes["slorouter.queued_ms"] = self.queued_ms
        return attributes
