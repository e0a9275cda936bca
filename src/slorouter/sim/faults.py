"""Faults a simulated pod can inject, so tests, benchmarks and users can play the same failures.

A fault is a JSON object (the body of ``POST /admin/faults``, or ``slorouter sim --fault``):

    {"fault": "hang", "probability": 0.5, "count": 3, "after_tokens": 2}

``fault`` names it (``FAULTS``), ``probability`` (0..1, default 1) is the chance that a request it applies to
gets it, ``count`` (default: no limit) how many requests get it before it retires itself; the other keys are
the fault's own parameters. ``parse_fault`` checks all of it and raises ``FaultError`` with a message that
names the bad key. ``FaultPlan`` holds a pod's active faults, at most one per name, and draws which request
gets one with its own seeded generator. ``parse_fault`` takes another catalogue of ``FaultKind`` too: the
prediction server's faults (``slorouter.predictor.faults``) are played the same way.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

# Where a fault strikes: the generation endpoints, the /metrics page, or the pod's listening socket.
INFERENCE, METRICS, LISTENER = "inference", "metrics", "listener"


@dataclass(frozen=True, slots=True)
class FaultParam:
    kind: type  # int or float (bool is refused for both)
    default: float | int | None
    low: float
    high: float
    help: str


@dataclass(frozen=True, slots=True)
class FaultKind:
    target: str
    help: str
    params: dict[str, FaultParam] = field(default_factory=dict)


_AFTER_TOKENS = FaultParam(int, 0, 0, 1_000_000, "stream this many tokens first (streams only)")
_MAX_BYTES = 1 << 30

FAULTS: dict[str, FaultKind] = {
    "kill-mid-stream": FaultKind(
        INFERENCE,
        "abort the TCP connection (RST) after after_tokens streamed tokens; a JSON request instead of its "
        "answer",
        {"after_tokens": FaultParam(int, 1, 0, 1_000_000, "tokens streamed before the abort")},
    ),
    "refuse": FaultKind(
        LISTENER,
        "stop listening and drop every connection for duration_s seconds (connections are refused), "
        "then listen again on the same port",
        {"duration_s": FaultParam(float, None, 0.001, 3600, "how long the pod refuses connections")},
    ),
    "hang": FaultKind(
        INFERENCE,
        "accept the request, then send nothing more until the client goes away: before the response head, "
        "or (streams) after after_tokens tokens when after_tokens > 0",
        {"after_tokens": _AFTER_TOKENS},
    ),
    "status": FaultKind(
        INFERENCE,
        "answer with HTTP status (default 500) and an OpenAI-style JSON error body",
        {"status": FaultParam(int, 500, 400, 599, "the HTTP status")},
    ),
    "non-json": FaultKind(INFERENCE, "answer 200 with a complete body that is not JSON (an HTML page)"),
    "truncated-json": FaultKind(
        INFERENCE,
        "announce the whole JSON answer's Content-Length, send half of it, close the connection "
        "(a stream: cut inside an event, then closed)",
    ),
    "invalid-sse": FaultKind(
        INFERENCE, "answer a stream with 200 text/event-stream whose body is not SSE, then end it"
    ),
    "large-body": FaultKind(
        INFERENCE,
        "answer 200 application/json with a valid JSON body of about bytes bytes (a stream: one event "
        "that large)",
        {"bytes": FaultParam(int, 64 << 20, 1, _MAX_BYTES, "size of the body")},
    ),
    "metrics-hang": FaultKind(METRICS, "GET /metrics never answers (until the client goes away)"),
    "metrics-garbage": FaultKind(METRICS, "GET /metrics answers 200 with a page that is not Prometheus text"),
    "metrics-flap": FaultKind(
        METRICS,
        "GET /metrics answers 500 for period_s seconds, then normally for period_s seconds, and so on",
        {"period_s": FaultParam(float, 1.0, 0.001, 3600, "length of each failing and each working phase")},
    ),
}

_COMMON = {"fault", "probability", "count"}


class FaultError(ValueError):
    """A fault description that cannot be played; the message names the bad key."""


@dataclass(slots=True)
class Fault:
    """One active fault: its name, when it fires and its parameters."""

    name: str
    target: str = INFERENCE
    probability: float = 1.0
    count: int | None = None  # requests still to be hit; None: no limit
    params: dict[str, float | int] = field(default_factory=dict)
    hits: int = 0
    since: float = 0.0  # when it was activated (the pod's clock): metrics-flap's phases count from here

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


def parse_fault(data: Any, catalogue: dict[str, FaultKind] = FAULTS) -> Fault:
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
    if kind.target == LISTENER and (fault.probability != 1.0 or fault.count is not None):
        raise FaultError(f"fault {name!r} strikes the pod once, at once: it takes no probability or count")
    return fault


def parse_fault_flag(text: str, catalogue: dict[str, FaultKind] = FAULTS) -> Fault:
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


class FaultPlan:
    """A pod's active faults (one per name) and the draw of which request gets one."""

    def __init__(self, seed: int = 0) -> None:
        self._faults: dict[str, Fault] = {}
        self._rng = random.Random(seed)

    def __bool__(self) -> bool:
        return bool(self._faults)

    def add(self, fault: Fault) -> None:
        """Activate ``fault``, replacing an active fault of the same name."""
        self._faults[fault.name] = fault

    def clear(self, name: str | None = None) -> int:
        """Retire one fault (or all); returns how many were active."""
        if name is None:
            count = len(self._faults)
            self._faults.clear()
            return count
        return 1 if self._faults.pop(name, None) is not None else 0

    def describe(self) -> list[dict[str, Any]]:
        return [fault.describe() for fault in self._faults.values()]

    def draw(self, target: str) -> Fault | None:
        """The fault the next request to ``target`` gets, if any (counted as a hit)."""
        for fault in list(self._faults.values()):
            if fault.target != target:
                continue
            if fault.probability < 1.0 and self._rng.random() >= fault.probability:
                continue
            fault.hits += 1
            if fault.count is not None:
                fault.count -= 1
                if fault.count <= 0:
                    del self._faults[fault.name]
            return fault
        return None

    def active(self, name: str) -> Fault | None:
        return self._faults.get(name)
