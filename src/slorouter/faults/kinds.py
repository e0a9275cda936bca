"""What a fault is: a catalogue of kinds (``FaultKind``, with their parameters), and a fault's JSON
description, checked against a catalogue.

A fault is a JSON object (the body of ``POST /admin/faults``, or a command's ``--fault`` flag):

    {"fault": "hang", "probability": 0.5, "count": 3, "after_tokens": 2}

``fault`` names it (a key of the catalogue), ``probability`` (0..1, default 1) is the chance that a request
it applies to gets it, ``count`` (default: no limit) how many requests get it before it retires itself; the
other keys are the fault's own parameters. ``parse_fault`` checks all of it and raises ``FaultError`` with a
message that names the bad key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class FaultParam:
    kind: type  # int or float (bool is refused for both)
    default: float | int | None
    low: float
    high: float
    help: str


@dataclass(frozen=True, slots=True)
class FaultKind:
    target: str  # where it strikes, in the words of the server that plays it
    help: str
    params: dict[str, FaultParam] = field(default_factory=dict)
    once: bool = False  # strikes once, when posted (takes no probability or count)


_COMMON = {"fault", "probability", "count"}


class FaultError(ValueError):
    """A fault description that cannot be played; the message names the bad key."""


@dataclass(slots=True)
class Fault:
    """One active fault: its name, when it fires and its parameters."""

    name: str
    target: str
    probability: float = 1.0
    count: int | None = None  # requests still to be hit; None: no limit
    params: dict[str, float | int] = field(default_factory=dict)
    hits: int = 0
    since: float = 0.0  # when it was activated (the server's clock), e.g. for phases

    def param(self, name: str) -> float:
        return self.params[name]

    def describe(self) -> dict[str, Any]:
        return {
            "fault": self.name,
            "probability": self.probability,
            "count": self.count,
            **self.params,
            "hits": self.hits,
        }


def _number(key: str, value: Any, kind: type, low: float, high: float) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultError(f"{key!r} must be a number, got {value!r}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise FaultError(f"{key!r} must be a whole number, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    if not low <= value <= high:  # also refuses NaN
        raise FaultError(f"{key!r} must be in {low:g}..{high:g}, got {value!r}")
    return value


def parse_fault(data: Any, catalogue: dict[str, FaultKind]) -> Fault:
    """A validated ``Fault`` of ``catalogue`` from its JSON description; ``FaultError`` names the problem."""
    if not isinstance(data, dict):
        raise FaultError(f"a fault must be a JSON object, got {type(data).__name__}")
    name = data.get("fault")
    if not isinstance(name, str):
        raise FaultError(f"'fault' must name a fault: one of {', '.join(sorted(catalogue))}")
    kind = catalogue.get(name)
    if kind is None:
        raise FaultError(f"unknown fault {name!r}: expected one of {', '.join(sorted(catalogue))}")
    unknown = sorted(set(data) - _COMMON - set(kind.params))
    if unknown:
        allowed = sorted(_COMMON | set(kind.params))
        raise FaultError(f"fault {name!r} has no parameter {unknown[0]!r} (it takes {', '.join(allowed)})")
    fault = Fault(name, kind.target)
    if "probability" in data:
        fault.probability = float(_number("probability", data["probability"], float, 0.0, 1.0))
    if data.get("count") is not None:
        fault.count = int(_number("count", data["count"], int, 1, 1e12))
    for key, spec in kind.params.items():
        if key in data:
            fault.params[key] = _number(key, data[key], spec.kind, spec.low, spec.high)
        elif spec.default is None:
            raise FaultError(f"fault {name!r} needs {key!r} ({spec.help})")
        else:
            fault.params[key] = spec.default
    if kind.once and (fault.probability != 1.0 or fault.count is not None):
        raise FaultError(f"fault {name!r} strikes once, at once: it takes no probability or count")
    return fault


def parse_fault_flag(text: str, catalogue: dict[str, FaultKind]) -> Fault:
    """``--fault NAME[,key=value...]`` (values are numbers) or the same JSON object as the admin API."""
    text = text.strip()
    if text.startswith("{"):
        try:
            return parse_fault(json.loads(text), catalogue)
        except json.JSONDecodeError as exc:
            raise FaultError(f"not valid JSON: {exc}") from None
    name, *pairs = text.split(",")
    data: dict[str, Any] = {"fault": name.strip()}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise FaultError(f"{pair!r} is not key=value")
        try:
            data[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            raise FaultError(f"{key.strip()!r} must be a number, got {value!r}") from None
    return parse_fault(data, catalogue)
