"""Fault injection's shared layer: a catalogue's faults parsed and drawn, and the /admin/faults API, without
the simulator (the prediction server plays its own catalogue through the same pieces)."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from slorouter.faults.admin import FaultAdmin
from slorouter.faults.kinds import FaultError, FaultKind, FaultParam, parse_fault, parse_fault_flag
from slorouter.faults.plan import FaultPlan
from slorouter.http.server import Response

CATALOGUE = {
    "slow": FaultKind("work", "answer late", {"delay_ms": FaultParam(float, None, 0.0, 1000.0, "the delay")}),
    "fail": FaultKind("work", "answer 500"),
    "crash": FaultKind("process", "stop at once", once=True),
}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"fault": "explode"}, "unknown fault 'explode': expected one of crash, fail, slow"),
        ({"fault": "slow"}, "needs 'delay_ms' (the delay)"),
        ({"fault": "slow", "delay_ms": 2000}, "'delay_ms' must be in 0..1000"),
        ({"fault": "fail", "delay_ms": 1}, "no parameter 'delay_ms' (it takes count, fault, probability)"),
        ({"fault": "crash", "count": 1}, "'crash' strikes once, at once: it takes no probability or count"),
    ],
)
def test_a_catalogues_faults_are_checked(data: dict[str, object], needle: str) -> None:
    with pytest.raises(FaultError, match=re.escape(needle)):
        parse_fault(data, CATALOGUE)


def test_a_flag_and_the_plan_play_a_catalogues_faults() -> None:
    plan = FaultPlan(seed=1)
    plan.add(parse_fault_flag("slow,delay_ms=5,count=1", CATALOGUE))
    assert plan.draw("process") is None
    fault = plan.draw("work")
    assert fault is not None and fault.param("delay_ms") == 5.0 and fault.target == "work"
    assert plan.draw("work") is None and not plan  # its one count spent


class _Routes:
    """Stands for the HTTP server: records the routes added."""

    def __init__(self) -> None:
        self.handlers: dict[tuple[str, str], Callable[[Any], Awaitable[Response]]] = {}

    def add_route(self, method: str, path: str, handler: Callable[[Any], Awaitable[Response]]) -> None:
        self.handlers[(method, path)] = handler


async def test_the_admin_api_takes_the_servers_catalogue() -> None:
    plan = FaultPlan()
    routes = _Routes()
    FaultAdmin(plan, CATALOGUE).add_routes(routes)  # type: ignore[arg-type]
    post = routes.handlers[("POST", "/admin/faults")]
    accepted = await post(SimpleNamespace(body=json.dumps({"fault": "fail"}).encode()))
    assert accepted.status == 200 and plan.active("fail") is not None
    refused = await post(SimpleNamespace(body=b'{"fault": "hang"}'))  # the simulator's, not this catalogue's
    assert refused.status == 400 and b"unknown fault 'hang'" in refused.body
