"""The queue against a small reference model (Hypothesis stateful tests).

The model is a plain list of queued requests; every rule of ``FlowQueues`` is checked after every step: no
request lost or duplicated, strict priority, FCFS or EDF order inside a flow, round-robin fairness (while a
flow stays backlogged, no other flow of its band is served twice), limits enforced exactly (a request is
rejected only when room could not be made, evictions only of lower-priority sheddable requests, newest
first), and exactly one outcome per queued request.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from slorouter.flowcontrol.policies import LeastAttainedService, RoundRobin
from slorouter.flowcontrol.queue import FlowQueues
from slorouter.flowcontrol.types import FlowKey, Limits, Outcome, QueuedRequest

GLOBAL = Limits(max_requests=8, max_bytes=30)
BAND = {0: Limits(max_requests=5)}
TENANTS = ("a", "b", "c")
PRIORITIES = (-2, -1, 0, 1)


class QueueMachine(RuleBasedStateMachine):
    ordering = "fcfs"
    fair = "round-robin"

    def __init__(self) -> None:
        super().__init__()
        fairness = RoundRobin if self.fair == "round-robin" else lambda: LeastAttainedService(5.0)
        self.queues = FlowQueues(fairness=fairness, ordering=self.ordering, limits=GLOBAL, band_limits=BAND)
        self.now = 0.0
        self.model: list[QueuedRequest] = []
        self.outcomes: dict[str, Outcome] = {}
        self.next_id = 0
        # waited[F][G]: dispatches of flow G since F was last served or became backlogged.
        self.waited: dict[FlowKey, dict[FlowKey, int]] = defaultdict(lambda: defaultdict(int))

    def _outcome(self, item: QueuedRequest, outcome: Outcome) -> None:
        assert item.request_id not in self.outcomes, f"{item.request_id} left twice"
        assert item in self.model, f"{item.request_id} was not queued"
        self.outcomes[item.request_id] = outcome
        self.model.remove(item)

    def _backlogged(self) -> set[FlowKey]:
        return {item.flow for item in self.model}

    @rule(
        tenant=st.sampled_from(TENANTS),
        priority=st.sampled_from(PRIORITIES),
        size=st.integers(1, 8),
        slo=st.none() | st.floats(0.5, 5.0),
        ttl=st.none() | st.floats(1.0, 8.0),
    )
    def add(self, tenant: str, priority: int, size: int, slo: float | None, ttl: float | None) -> None:
        self.next_id += 1
        item = QueuedRequest(
            str(self.next_id),
            FlowKey(tenant, priority),
            self.now,
            size_bytes=size,
            cost_tokens=size * 10,
            sheddable=priority < 0,
            slo_deadline=None if slo is None else self.now + slo,
            ttl_deadline=None if ttl is None else self.now + ttl,
        )
        before = self._backlogged()
        expected_victims = self._expected_victims(item)
        result = self.queues.add(item)
        if expected_victims is None:
            assert not result.accepted and not result.evicted
            return
        assert result.accepted, result.rejection
        assert list(result.evicted) == expected_victims
        for victim in result.evicted:
            self._outcome(victim, Outcome.EVICTED)
        self.model.append(item)
        if item.flow not in before:
            self.waited[item.flow] = defaultdict(int)

    def _expected_victims(self, item: QueuedRequest) -> list[QueuedRequest] | None:
        band = [m for m in self.model if m.priority == item.priority]
        band_limit = BAND.get(item.priority)
        if (
            band_limit is not None
            and band_limit.max_requests is not None
            and len(band) >= band_limit.max_requests
        ):
            return None
        need_n = len(self.model) + 1 - (GLOBAL.max_requests or 0)
        need_b = sum(m.size_bytes for m in self.model) + item.size_bytes - (GLOBAL.max_bytes or 0)
        victims = sorted(
            (m for m in self.model if m.sheddable and m.priority < item.priority),
            key=lambda m: (m.priority, -m.arrival, -m.seq),
        )
        chosen = []
        for victim in victims:
            if need_n <= 0 and need_b <= 0:
                break
            chosen.append(victim)
            need_n -= 1
            need_b -= victim.size_bytes
        if need_n > 0 or need_b > 0:
            return None
        return chosen

    @precondition(lambda self: self.model)
    @rule()
    def pop(self) -> None:
        backlogged = self._backlogged()
        item = self.queues.pop(self.now)
        assert item is not None
        top = max(m.priority for m in self.model)
        assert item.priority == top, "strict priority"
        same_flow = [m for m in self.model if m.flow == item.flow]
        key = (lambda m: (m.arrival, m.seq)) if self.ordering == "fcfs" else (lambda m: (m.edf_key, m.seq))
        assert key(item) == min(key(m) for m in same_flow), "order inside the flow"
        if self.fair == "round-robin":
            for flow in backlogged:
                if flow.priority == item.priority and flow != item.flow:
                    assert self.waited[flow][item.flow] < 1, f"{item.flow} served twice while {flow} waited"
                    self.waited[flow][item.flow] += 1
            self.waited[item.flow] = defaultdict(int)
        self._outcome(item, Outcome.DISPATCHED)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(self.model))
        assert self.queues.remove(item)
        self._outcome(item, Outcome.CANCELLED)
        assert not self.queues.remove(item), "removed twice"

    @rule(dt=st.floats(0.0, 3.0))
    def advance(self, dt: float) -> None:
        self.now += dt
        expected = {}
        for m in self.model:
            if m.ttl_deadline is not None and m.ttl_deadline <= self.now:
                expected[m.request_id] = Outcome.EXPIRED
            elif m.sheddable and m.slo_deadline is not None and m.slo_deadline <= self.now:
                expected[m.request_id] = Outcome.EVICTED
        got = self.queues.due(self.now)
        assert {item.request_id: outcome for item, outcome in got} == expected
        for item, outcome in got:
            self._outcome(item, outcome)

    @invariant()
    def same_contents(self) -> None:
        assert sorted(i.request_id for i in self.queues.items()) == sorted(m.request_id for m in self.model)
        assert len(self.queues) == len(self.model)
        assert self.queues.bytes == sum(m.size_bytes for m in self.model)

    @invariant()
    def limits_hold(self) -> None:
        assert len(self.model) <= (GLOBAL.max_requests or 0)
        assert sum(m.size_bytes for m in self.model) <= (GLOBAL.max_bytes or 0)
        for priority, limits in BAND.items():
            assert sum(m.priority == priority for m in self.model) <= (limits.max_requests or 0)

    @invariant()
    def exactly_one_outcome(self) -> None:
        queued = {m.request_id for m in self.model}
        assert not queued & self.outcomes.keys()
        accepted = queued | self.outcomes.keys()
        assert all(item.queued for item in self.model)
        assert len(accepted) == len(queued) + len(self.outcomes)


class EdfQueueMachine(QueueMachine):
    ordering = "slo-deadline"


class LasQueueMachine(QueueMachine):
    fair = "program-aware-fairness"


RUNS = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestFcfsRoundRobin = QueueMachine.TestCase
TestFcfsRoundRobin.settings = RUNS
TestEdfRoundRobin = EdfQueueMachine.TestCase
TestEdfRoundRobin.settings = RUNS
TestLeastAttainedService = LasQueueMachine.TestCase
TestLeastAttainedService.settings = RUNS
