"""Each rule of the flow-control queue and its policies, one test each."""

from __future__ import annotations

import pytest

from slorouter.flowcontrol.policies import LeastAttainedService, RoundRobin, fairness_policy, ordering_key
from slorouter.flowcontrol.queue import FlowQueues
from slorouter.flowcontrol.types import FlowKey, Limits, Outcome, QueuedRequest


def _item(rid: str, tenant: str = "t", priority: int = 0, at: float = 0.0, **kw: object) -> QueuedRequest:
    return QueuedRequest(rid, FlowKey(tenant, priority), at, sheddable=priority < 0, **kw)  # type: ignore[arg-type]


def _queues(**kw: object) -> FlowQueues:
    return FlowQueues(fairness=RoundRobin, **kw)  # type: ignore[arg-type]


def _drain(q: FlowQueues, now: float = 0.0) -> list[str]:
    out = []
    while (item := q.pop(now)) is not None:
        out.append(item.request_id)
    return out


def test_strict_priority_bands() -> None:
    q = _queues()
    for rid, p in (("low", -1), ("std", 0), ("high", 5), ("std2", 0)):
        assert q.add(_item(rid, priority=p)).accepted
    assert _drain(q) == ["high", "std", "std2", "low"]


def test_fcfs_inside_a_flow() -> None:
    q = _queues()
    q.add(_item("late", at=2.0, slo_deadline=2.5))
    q.add(_item("early", at=1.0, slo_deadline=9.0))
    assert _drain(q) == ["early", "late"]  # by arrival (received) time, whatever the deadlines


def test_slo_deadline_ordering_puts_requests_without_slo_last() -> None:
    q = _queues(ordering="slo-deadline")
    q.add(_item("none", at=0.0))
    q.add(_item("loose", at=0.0, slo_deadline=9.0))
    q.add(_item("tight", at=1.0, slo_deadline=2.0))
    assert _drain(q) == ["tight", "loose", "none"]


def test_round_robin_across_flows_of_a_band() -> None:
    q = _queues()
    for i in range(4):
        q.add(_item(f"a{i}", tenant="a"))
    q.add(_item("b0", tenant="b"))
    q.add(_item("b1", tenant="b"))
    assert _drain(q) == ["a0", "b0", "a1", "b1", "a2", "a3"]


def test_least_attained_service_charges_tokens_with_decay() -> None:
    q = FlowQueues(fairness=lambda: LeastAttainedService(half_life_s=10.0))
    for i in range(3):
        q.add(_item(f"big{i}", tenant="big", cost_tokens=1000))
        q.add(_item(f"small{i}", tenant="small", cost_tokens=100))
    # big is served once (1000 tokens), then small until it has attained as much.
    assert _drain(q) == ["big0", "small0", "small1", "small2", "big1", "big2"]
    las = LeastAttainedService(half_life_s=10.0)
    las.served(FlowKey("x", 0), 100.0, now=0.0)
    assert las.attained(FlowKey("x", 0), now=10.0) == pytest.approx(50.0)


def test_band_limit_rejects_without_evicting() -> None:
    q = _queues(band_limits={0: Limits(max_requests=1)}, limits=Limits(max_requests=10))
    q.add(_item("shed", priority=-1))
    assert q.add(_item("a")).accepted
    result = q.add(_item("b"))
    assert not result.accepted and result.rejection is not None
    assert result.rejection.limit == "maxRequests" and not result.evicted
    assert len(q) == 2


def test_global_bytes_limit_is_exact() -> None:
    q = _queues(limits=Limits(max_bytes=10))
    assert q.add(_item("a", size_bytes=6)).accepted
    assert q.add(_item("b", size_bytes=4)).accepted
    result = q.add(_item("c", size_bytes=1))
    assert result.rejection is not None and result.rejection.limit == "maxBytes"


def test_full_queue_evicts_lowest_priority_newest_sheddable_first() -> None:
    q = _queues(limits=Limits(max_requests=4))
    q.add(_item("s1-old", priority=-1, at=0.0))
    q.add(_item("s1-new", priority=-1, at=1.0))
    q.add(_item("s2-new", priority=-2, at=1.0))
    q.add(_item("keep", priority=0, at=0.0))
    result = q.add(_item("critical", priority=5, at=2.0))
    assert [v.request_id for v in result.evicted] == ["s2-new"]
    result = q.add(_item("critical2", priority=5, at=2.0))
    assert [v.request_id for v in result.evicted] == ["s1-new"]


def test_non_sheddable_requests_are_never_evicted() -> None:
    q = _queues(limits=Limits(max_requests=1))
    q.add(_item("standard", priority=0))
    result = q.add(_item("critical", priority=9))
    assert not result.accepted and not result.evicted
    assert [i.request_id for i in q.items()] == ["standard"]


def test_no_eviction_when_it_would_not_make_enough_room() -> None:
    q = _queues(limits=Limits(max_bytes=10))
    q.add(_item("shed", priority=-1, size_bytes=2))
    q.add(_item("std", priority=0, size_bytes=8))
    result = q.add(_item("big", priority=1, size_bytes=5))
    assert not result.accepted and not result.evicted
    assert len(q) == 2


def test_ttl_expires_and_sheddable_past_slo_is_evicted() -> None:
    q = _queues()
    q.add(_item("ttl", ttl_deadline=5.0))
    q.add(_item("shed-slo", priority=-1, slo_deadline=2.0, ttl_deadline=9.0))
    q.add(_item("std-slo", slo_deadline=2.0))  # non-sheddable: waits past its SLO
    assert q.next_deadline() == 2.0
    assert q.due(1.9) == []
    assert [(i.request_id, o) for i, o in q.due(2.0)] == [("shed-slo", Outcome.EVICTED)]
    assert [(i.request_id, o) for i, o in q.due(5.0)] == [("ttl", Outcome.EXPIRED)]
    assert q.next_deadline() is None
    assert _drain(q) == ["std-slo"]


def test_remove_takes_a_request_out_at_once() -> None:
    q = _queues(limits=Limits(max_requests=1))
    item = _item("gone", ttl_deadline=1.0)
    q.add(item)
    assert q.remove(item) and not q.remove(item)
    assert len(q) == 0 and q.bytes == 0 and q.due(5.0) == [] and q.pop(0.0) is None
    assert q.add(_item("next")).accepted  # its place is free


def test_unknown_policies_are_errors() -> None:
    with pytest.raises(ValueError, match="ordering policy"):
        ordering_key("lifo")
    with pytest.raises(ValueError, match="fairness policy"):
        fairness_policy("strict")
