"""The spans of one request, made with the OpenTelemetry SDK (imported only when tracing is on).

One SERVER span per inference request (``slorouter.request``), continuing the client's W3C trace context
when it brings one; under it, per attempt, an INTERNAL span for the scheduling (``slorouter.schedule``: the
data producers, the latency predictor among them, the admitters, the profiles, the pick) and a CLIENT span
for the model server's exchange (``slorouter.upstream``), whose context goes to the model server as its
``traceparent``. The front-ends hold a ``RequestTrace`` only when tracing is on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from slorouter.tracing.config import TracingConfig

REQUEST_SPAN = "slorouter.request"
SCHEDULE_SPAN = "slorouter.schedule"
UPSTREAM_SPAN = "slorouter.upstream"
INSTRUMENTATION = "slorouter"

Attributes = Mapping[str, AttributeValue]


class Tracing:
    """The router's tracer provider (its own, not the process-wide one) and the W3C propagator."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION)
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def build(cls, config: TracingConfig, exporter: SpanExporter | None = None) -> Tracing:
        """Spans batched to the OTLP/gRPC collector of ``config``, or handed one by one to ``exporter``."""
        sampler = ParentBased(TraceIdRatioBased(config.sampling.sampler_arg))
        provider = TracerProvider(
            sampler=sampler, resource=Resource.create({SERVICE_NAME: config.service_name})
        )
        if exporter is None:
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(config.otel_exporter_endpoint)))
        else:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        return cls(provider)

    def start_request(self, headers: Mapping[str, str], attributes: Attributes) -> RequestTrace:
        """The span of one request; ``headers`` (lower-case names) may carry the caller's trace context."""
        parent = self._propagator.extract(headers)
        span = self._tracer.start_span(
            REQUEST_SPAN, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        if not span.is_recording():
            # Not sampled: nothing is recorded, so no child span is made (each costs a sampling decision and
            # new ids); the model server still gets the unsampled context, as W3C asks.
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier, context=trace.set_span_in_context(span))
            return UnsampledTrace(self, span, carrier)
        return RequestTrace(self, span)

    def shutdown(self) -> None:
        """Export what is still buffered, then stop (blocks: run it off the event loop)."""
        self._provider.shutdown()


def _otlp_exporter(endpoint: str) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        if not (exc.name or "").startswith("opentelemetry.proto"):
            raise
        from slorouter.tracing.config import TracingUnavailableError

        # xds-protos (the ext_proc protos) ships an old copy of these modules under the same import path;
        # whichever package was installed last owns them (grpc/grpc#42926).
        raise TracingUnavailableError(
            f"the OTLP exporter cannot import {exc.name} ({exc}): another package (xds-protos) has "
            "overwritten opentelemetry-proto's modules; reinstall it after the others: "
            "pip install --no-deps --force-reinstall opentelemetry-proto"
        ) from None
    return OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))


class RequestTrace:
    """One request's spans. Every ``end*`` is safe to call more than once; the first counts."""

    __slots__ = ("_ended", "_schedule", "_tracing", "_upstream", "span")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self.span = span
        self._schedule: Span | None = None
        self._upstream: Span | None = None
        self._ended = False

    def set(self, attributes: Attributes) -> None:
        """Attributes of the request's span."""
        self.span.set_attributes(attributes)

    def begin_schedule(self, attributes: Attributes) -> None:
        self._schedule = self._child(SCHEDULE_SPAN, SpanKind.INTERNAL, attributes)

    def end_schedule(self, attributes: Attributes | None = None, error: str | None = None) -> None:
        span, self._schedule = self._schedule, None
        if span is not None:
            _finish(span, attributes, error)

    def begin_upstream(self, attributes: Attributes) -> dict[str, str]:
        """Start the model server's span; returns the headers that carry it there (``traceparent``, and the
        caller's ``tracestate``)."""
        span = self._upstream = self._child(UPSTREAM_SPAN, SpanKind.CLIENT, attributes)
        carrier: dict[str, str] = {}
        self._tracing._propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def end_upstream(
        self, status: int | None, error: str | None = None, attributes: Attributes | None = None
    ) -> None:
        span, self._upstream = self._upstream, None
        if span is None:
            return
        if status:
            span.set_attribute("http.response.status_code", status)
            if error is None and status >= 400:
                error = f"status {status}"
        _finish(span, attributes, error)

    def end(self, status: int | None, error: str | None = None) -> None:
        """The request is over: its open children end too (with ``error``, if any)."""
        if self._ended:
            return
        self._ended = True
        self.end_schedule(error=error)
        self.end_upstream(None, error)
        span = self.span
        if status:
            span.set_attribute("http.response.status_code", status)
            if error is None and status >= 500:
                error = f"status {status}"
        _finish(span, None, error)

    def _child(self, name: str, kind: SpanKind, attributes: Attributes) -> Span:
        return self._tracing._tracer.start_span(
            name, context=trace.set_span_in_context(self.span), kind=kind, attributes=attributes
        )


class UnsampledTrace(RequestTrace):
    """A request the sampler left out: every call is a no-op; the upstream headers carry its context."""

    __slots__ = ("_carrier",)

    def __init__(self, tracing: Tracing, span: Span, carrier: dict[str, str]) -> None:
        super().__init__(tracing, span)
        self._carrier = carrier

    def set(self, attributes: Attributes) -> None:
        pass

    def begin_schedule(self, attributes: Attributes) -> None:
        pass

    def end_schedule(self, attributes: Attributes | None = None, error: str | None = None) -> None:
        pass

    def begin_upstream(self, attributes: Attributes) -> dict[str, str]:
        return dict(self._carrier)

    def end_upstream(
        self, status: int | None, error: str | None = None, attributes: Attributes | None = None
    ) -> None:
        pass

    def end(self, status: int | None, error: str | None = None) -> None:
        pass


def _finish(span: Span, attributes: Attributes | None, error: str | None) -> None:
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()
