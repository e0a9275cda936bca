"""The ``tracing`` section of the router's YAML, in the original's shape (``enabled``,
``otelExporterEndpoint``, ``sampling.sampler`` / ``sampling.samplerArg``), and the tracer it builds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import ConfigDict, Field, field_validator

from slorouter.extras import install_hint
from slorouter.validation import StrictModel

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from slorouter.tracing.tracer import Tracing


class TracingUnavailableError(RuntimeError):
    """Tracing is enabled but the OpenTelemetry SDK (the ``tracing`` extra) is not installed."""


class _CamelModel(StrictModel):
    model_config = ConfigDict(populate_by_name=False)


class SamplingConfig(_CamelModel):
    sampler: Literal["parentbased_traceidratio"] = Field(
        default="parentbased_traceidratio",
        description="the only one, as in the original: a request that brings a sampled traceparent is "
        "traced, one that brings an unsampled one is not, others are with probability samplerArg",
    )
    sampler_arg: float = Field(
        default=0.1, ge=0, le=1, alias="samplerArg", description="share of new traces sampled, 0 to 1"
    )

    @field_validator("sampler_arg", mode="before")
    @classmethod
    def _number_text(cls, value: object) -> object:
        # The original's Helm values give it as a string ("0.1").
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a number between 0 and 1") from None
        return value


class TracingConfig(_CamelModel):
    enabled: bool = Field(default=False, description="off: no span is made, no header added")
    otel_exporter_endpoint: str = Field(
        default="http://localhost:4317",
        min_length=1,
        alias="otelExporterEndpoint",
        description="the OTLP/gRPC collector; http:// sends in plain text, https:// over TLS",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    service_name: str = Field(
        default="slorouter", min_length=1, alias="serviceName", description="the service.name resource"
    )

    @field_validator("otel_exporter_endpoint")
    @classmethod
    def _endpoint_scheme(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} must start with http:// or https:// (e.g. http://localhost:4317)")
        return value

    def build(self, exporter: SpanExporter | None = None) -> Tracing | None:
        """The tracer (None when tracing is off). ``exporter``: where spans go instead of the OTLP
        collector (tests: the SDK's in-memory exporter). Raises ``TracingUnavailableError`` without the
        SDK."""
        if not self.enabled:
            return None
        try:
            from slorouter.tracing.tracer import Tracing
        except ImportError as exc:
            if (exc.name or "").startswith("opentelemetry"):
                raise TracingUnavailableError(
                    "tracing needs the OpenTelemetry SDK, which is not installed "
                    f"({exc.name}): {install_hint('tracing')}"
                ) from None
            raise
        return Tracing.build(self, exporter)
