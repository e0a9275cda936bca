"""Workload parameters: pydantic models with defaults, overridable by name from strings or numbers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, Field, ValidationError

from slorouter.validation import StrictModel, format_validation_error


def _none_words(value: object) -> object:
    if isinstance(value, str) and value.strip().lower() in ("", "none", "null"):
        return None
    return value


# A positive number, or none: "none"/"null"/"" from a command line mean no value.
OptionalPositive = Annotated[Annotated[float, Field(gt=0)] | None, BeforeValidator(_none_words)]
Share = Annotated[float, Field(ge=0, le=1)]
RelStd = Annotated[float, Field(ge=0, le=0.5)]
PositiveInt = Annotated[int, Field(ge=1)]
Positive = Annotated[float, Field(gt=0)]


class WorkloadParams(StrictModel):
    """Parameters every workload takes: the SLOs its requests carry and the share that is sheddable."""

    slo_ttft_ms: OptionalPositive = None  # x-slo-ttft-ms of every request
    slo_tpot_ms: OptionalPositive = None  # x-slo-tpot-ms of every request
    sheddable_share: Share = 0.0  # share of requests sent with priority -1 (sheddable)


P = TypeVar("P", bound=WorkloadParams)


def parse_params(workload: str, model: type[P], params: Mapping[str, str | int | float] | None) -> P:
    """Defaults of ``model`` overridden by ``params``; ``ValueError`` naming the workload and parameter."""
    given: dict[str, Any] = dict(params or {})
    unknown = sorted(set(given) - set(model.model_fields))
    if unknown:
        known = ", ".join(model.model_fields)
        raise ValueError(f"workload {workload!r}: unknown parameter {unknown[0]!r} (known: {known})")
    try:
        return model.model_validate(given)
    except ValidationError as error:
        raise ValueError(f"workload {workload!r}: parameter {format_validation_error(error, '')}") from None


def defaults(model: type[WorkloadParams]) -> dict[str, Any]:
    """Every parameter of ``model`` with its default."""
    return model().model_dump()
