"""The strict pydantic base of every configuration model, and its errors as one-line messages that name the
offending key."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class StrictModel(BaseModel):
    """Unknown keys are errors and a validated model is immutable; a subclass may add to ``model_config``
    (it is merged with this one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def join_location(location: str, sub: str) -> str:
    """``a.b`` + ``c`` → ``a.b.c``; ``a`` + ``[2]`` → ``a[2]``."""
    if not location:
        return sub
    if not sub:
        return location
    return f"{location}{sub}" if sub.startswith("[") else f"{location}.{sub}"


def _format_loc(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text = join_location(text, f"[{part}]" if isinstance(part, int) else str(part))
    return text


def _error_text(message: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    return message[:1].lower() + message[1:]


def format_validation_error(error: ValidationError, location: str) -> str:
    """One line per problem: ``<location>.<field path>: <message>``."""
    lines = []
    for detail in error.errors():
        where = join_location(location, _format_loc(tuple(detail["loc"])))
        lines.append(f"{where}: {_error_text(detail['msg'])}" if where else _error_text(detail["msg"]))
    return "; ".join(lines)
