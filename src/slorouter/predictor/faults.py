"""Faults a prediction server can inject (``--enable-fault-injection``), so tests and users can play the
failures the router's ``PredictionClient`` must survive.

The faults are played like the simulator's (``slorouter.sim.faults``: the same JSON object, ``probability``
and ``count``), through ``GET``/``POST``/``DELETE /admin/faults``, which exist only when the server was
started with the flag: a production server exposes no way to break it.

They strike the prediction endpoints (``POST /v1/predict/bulk`` and ``/v1/predict``); ``/readyz``,
``/healthz`` and ``/metrics`` keep answering, as they do when a real server's predictions go wrong.
"""

from __future__ import annotations

import json
import urllib.parse

from slorouter.http.server import HttpRequest, HttpServer, Response, json_error
from slorouter.sim.faults import FaultError, FaultKind, FaultParam, FaultPlan, parse_fault

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


def _json(data: object, status: int = 200) -> Response:
    return Response(status, json.dumps(data).encode(), content_type=b"application/json")


class FaultAdmin:
    """The ``/admin/faults`` routes over a ``FaultPlan`` of ``PREDICTION_FAULTS``."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan

    def add_routes(self, http: HttpServer) -> None:
        http.add_route("GET", "/admin/faults", self._list)
        http.add_route("POST", "/admin/faults", self._add)
        http.add_route("DELETE", "/admin/faults", self._clear)

    async def _list(self, _: HttpRequest) -> Response:
        return _json({"faults": self.plan.describe()})

    async def _add(self, request: HttpRequest) -> Response:
        try:
            data = json.loads(request.body)
        except ValueError as exc:
            return json_error(400, f"the fault is not valid JSON: {exc}")
        try:
            fault = parse_fault(data, PREDICTION_FAULTS)
        except FaultError as exc:
            return json_error(400, str(exc), param="fault")
        self.plan.add(fault)
        return _json({"fault": fault.describe(), "faults": self.plan.describe()})

    async def _clear(self, request: HttpRequest) -> Response:
        query = urllib.parse.parse_qs(request.query.decode("latin-1"), keep_blank_values=True)
        if set(query) - {"fault"} or len(query.get("fault", ())) > 1:
            return json_error(400, "DELETE /admin/faults takes at most one query parameter: ?fault=NAME")
        names = query.get("fault")
        cleared = self.plan.clear(names[0] if names else None)
        return _json({"cleared": cleared, "faults": self.plan.describe()})
