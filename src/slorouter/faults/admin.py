"""``GET``/``POST``/``DELETE /admin/faults``: the fault-injection API, shared by ``slorouter sim`` and the
prediction server (``--enable-fault-injection``), each over a ``FaultPlan`` of its own catalogue of faults."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable

from slorouter.faults.kinds import Fault, FaultError, FaultKind, parse_fault
from slorouter.faults.plan import FaultPlan
from slorouter.http.server import HttpRequest, HttpServer, Response, json_error

_JSON = b"application/json; charset=utf-8"


def _json(data: object) -> Response:
    return Response(200, json.dumps(data).encode(), content_type=_JSON)


class FaultAdmin:
    """The ``/admin/faults`` routes over ``plan``; a posted fault of ``catalogue`` goes to ``activate``
    (``plan.add`` by default; the simulator's listener faults strike at once instead)."""

    def __init__(
        self,
        plan: FaultPlan,
        catalogue: dict[str, FaultKind],
        activate: Callable[[Fault, HttpRequest], None] | None = None,
    ) -> None:
        self.plan = plan
        self.catalogue = catalogue
        self._activate = activate or (lambda fault, _: plan.add(fault))

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
            fault = parse_fault(data, self.catalogue)
        except FaultError as exc:
            return json_error(400, str(exc), param="fault")
        self._activate(fault, request)
        return _json({"fault": fault.describe(), "faults": self.plan.describe()})

    async def _clear(self, request: HttpRequest) -> Response:
        query = urllib.parse.parse_qs(request.query.decode("latin-1"), keep_blank_values=True)
        if set(query) - {"fault"} or len(query.get("fault", ())) > 1:
            return json_error(400, "DELETE /admin/faults takes at most one query parameter: ?fault=NAME")
        names = query.get("fault")
        cleared = self.plan.clear(names[0] if names else None)
        return _json({"cleared": cleared, "faults": self.plan.describe()})
