"""The facts of a pick every front-end reports, derived once: which endpoint serves the request, how it was
picked, why it went without predictions, what was predicted for it and how long it queued. The response
headers and the span attributes are two renderings of them."""

from __future__ import annotations

from dataclasses import dataclass

from slorouter.director import RequestLifecycle
from slorouter.flowcontrol.types import QUEUED_HEADER
from slorouter.serving.scores_header import (
    RUNNER_UP_HEADER,
    SCORES_HEADER,
    SCORES_OMITTED_HEADER,
    PickScores,
    pick_scores,
)

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
    scores: PickScores | None = None  # audit.scores_header: the candidates' scores
    pick_reason: str | None = None  # with ``scores``: why the choice was made (a PickReason)

    @classmethod
    def of(cls, lifecycle: RequestLifecycle, scores_max_candidates: int | None = None) -> RoutingFacts:
        """``scores_max_candidates``: list that many candidates' scores (None: none)."""
        predicted = lifecycle.prediction
        record = lifecycle.result.record if scores_max_candidates is not None else None
        return cls(
            lifecycle.target.address,
            str(lifecycle.route),
            lifecycle.fallback_reason,
            None if predicted is None else predicted.ttft_ms,
            None if predicted is None else predicted.tpot_ms,
            None if lifecycle.admission.ticket is None else lifecycle.queued_s * 1000,
            None if record is None else pick_scores(record, scores_max_candidates or 0),
            None if record is None else record.reason.value,
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
        if self.scores is not None:
            headers += self._score_headers(self.scores)
        return headers

    @staticmethod
    def _score_headers(scores: PickScores) -> list[tuple[str, str]]:
        headers = [(SCORES_HEADER, scores.header)]
        if scores.runner_up is not None:
            headers.append((RUNNER_UP_HEADER, scores.runner_up))
        if scores.omitted:
            headers.append((SCORES_OMITTED_HEADER, str(scores.omitted)))
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
        if self.scores is not None:
            text = "".join(f"{name}: {value}\r\n" for name, value in self._score_headers(self.scores))
            lines += text.encode("latin-1")
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
        scores = self.scores
        if scores is not None:
            attributes["slorouter.scores"] = scores.header
            if scores.runner_up is not None:
                attributes["slorouter.runner_up"] = scores.runner_up
            if scores.omitted:
                attributes["slorouter.scores_omitted"] = scores.omitted
        if self.pick_reason is not None:
            attributes["slorouter.pick_reason"] = self.pick_reason
        return attributes
