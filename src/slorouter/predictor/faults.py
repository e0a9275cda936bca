"""Faults a prediction server can inject (``--enable-fault-injection``), so tests and users can play the
failures the router's ``PredictionClient`` must survive.

The faults are played like the simulator's (``slorouter.faults``: the same JSON object, ``probability``
and ``count``), through ``GET``/``POST``/``DELETE /admin/faults``, which exist only when the server was
started with the flag: a production server exposes no way to break it.

They strike the prediction endpoints (``POST /v1/predict/bulk`` and ``/v1/predict``); ``/readyz``,
``/healthz`` and ``/metrics`` keep answering, as they do when a real server's predictions go wrong.
"""

from __future__ import annotations

from slorouter.faults.kinds import FaultKind, FaultParam

PREDICT = "predict"

PREDICTION_FAULTS: dict[str, FaultKind] = {
    "hang": FaultKind(PREDICT, "accept the request, then send nothing until the client goes away"),
    "delay": FaultKind(
        PREDICT,
        "answer correctly after delay_ms more milliseconds (with probability < 1: a slow tail, e.g. p99)",
        {"delay_ms": FaultParam(float, None, 0.0, 3_600_000.0, "the added latency")},
    ),
    "status": FaultKind(
        PREDICT,
        "answer with HTTP status (default 500) and a JSON error body",
        {"status": FaultParam(int, 500, 400, 599, "the HTTP status")},
    ),
    "malformed": FaultKind(
        PREDICT, "answer 200 with a body that is not predictions (an HTML page, of the requested type)"
    ),
    "nan": FaultKind(PREDICT, "answer 200 with well-formed predictions whose TTFT values are NaN"),
    "inf": FaultKind(PREDICT, "answer 200 with well-formed predictions whose TTFT values are +infinity"),
    "negative": FaultKind(PREDICT, "answer 200 with well-formed predictions whose TTFT values are -1 ms"),
}

# The TTFT value each bad-value fault writes into an otherwise correct answer.
BAD_VALUES = {"nan": float("nan"), "inf": float("inf"), "negative": -1.0}

NOT_PREDICTIONS = b"<html><body>502 Bad Gateway (injected fault: malformed)</body></html>"
