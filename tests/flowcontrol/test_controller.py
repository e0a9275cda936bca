"""The controller (tickets, reservations, the pump) and the saturation detector."""

from __future__ import annotations

import math

import pytest

from slorouter.clock import ManualClock
from slorouter.flowcontrol.config import FlowControlConfig
from slorouter.flowcontrol.controller import FlowController, Ticket
from slorouter.flowcontrol.policies import RoundRobin
from slorouter.flowcontrol.queue import FlowQueues
from slorouter.flowcontrol.saturation import SaturationDetector, SaturationThresholds
from slorouter.flowcontrol.types import FlowKey, Limits, Outcome, QueuedRequest
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState


def _pool(n: int = 1) -> PoolState:
    return PoolState([Endpoint(f"pod-{i}:8000") for i in range(n)])


def _controller(pool: PoolState, clock: ManualClock, **thresholds: object) -> FlowController:
    detector = SaturationDetector(pool, SaturationThresholds(**thresholds))  # type: ignore[arg-type]
    queues = FlowQueues(fairness=RoundRobin, limits=Limits(max_requests=3))
    return FlowController(queues, detector, clock)


def _item(rid: str, clock: ManualClock, priority: int = 0, **kw: object) -> QueuedRequest:
    return QueuedRequest(rid, FlowKey("t", priority), clock.now(), sheddable=priority < 0, **kw)  # type: ignore[arg-type]


def test_detector_room_from_configured_and_learned_limits() -> None:
    pool = _pool(2)
    detector = SaturationDetector(pool, SaturationThresholds(queue_depth_threshold=2))
    assert detector.room() == math.inf  # caps unknown, no engine queue
    pool.set_metrics("pod-0:8000", MetricsSnapshot(waiting=3, running=4), 0.0)
    pool.add_inflight("pod-0:8000", 5, 0, 0, 0)
    pool.set_metrics("pod-1:8000", MetricsSnapshot(kv_usage=0.9), 0.0)
    assert detector.room() == 1  # pod-0: cap 4 + 2 − 5 in flight; pod-1: KV full
    assert detector.cap("pod-0:8000") == 4
    assert detector.saturation() == 0.5
    configured = SaturationDetector(
        pool, SaturationThresholds(max_inflight_requests=8, kv_cache_util_threshold=1)
    )
    assert configured.room() == 3 + 8


def test_work_conserving_dispatch_and_reservations() -> None:
    pool, clock = _pool(), ManualClock()
    fc = _controller(pool, clock, max_inflight_requests=1)
    first = fc.submit(_item("1", clock))
    assert first.outcome is Outcome.DISPATCHED and fc.reserved == 1
    second = fc.submit(_item("2", clock))
    assert second.outcome is None and len(fc) == 1  # the first's reservation holds the only slot
    pool.add_inflight("pod-0:8000", 1, 0, 0, 0)  # the first is dispatched: counted in flight
    fc.release(first)
    assert second.outcome is None
    clock.advance(0.5)
    pool.add_inflight("pod-0:8000", -1, 0, 0, 0)  # it finished
    fc.service()
    assert second.outcome is Outcome.DISPATCHED and second.queued_s == 0.5


def test_each_ticket_gets_one_outcome_through_its_callback() -> None:
    pool, clock = _pool(), ManualClock()
    fc = _controller(pool, clock, max_inflight_requests=0)
    seen: list[tuple[str, Outcome | None]] = []

    def record(ticket: Ticket) -> None:
        seen.append((ticket.item.request_id, ticket.outcome))

    shed = fc.submit(_item("shed", clock, priority=-1, slo_deadline=1.0), record)
    ttl = fc.submit(_item("ttl", clock, ttl_deadline=2.0), record)
    gone = fc.submit(_item("gone", clock), record)
    full = fc.submit(_item("full", clock, priority=-1), record)  # no lower priority to evict
    assert full.rejection is not None and full.outcome is None
    assert fc.cancel(gone) and not fc.cancel(gone)
    clock.set(1.0)
    fc.service()
    clock.set(2.0)
    fc.service()
    assert seen == [("gone", Outcome.CANCELLED), ("shed", Outcome.EVICTED), ("ttl", Outcome.EXPIRED)]
    assert shed.reason == "slo" and ttl.reason == "ttl" and len(fc) == 0 and fc.reserved == 0


def test_a_newcomer_to_an_empty_queue_gets_the_looser_prefill_bound() -> None:
    pool, clock = _pool(), ManualClock()
    fc = _controller(pool, clock, prefill_target_s=0.5, queued_prefill_target_s=0.05)
    for _ in range(fc.detector.prefill_rates.min_samples):  # 10,000 tok/s: bounds 5,000 and 500 tokens
        fc.detector.observe_first_token("pod-0:8000", 10_000, 1.0)
    pool.add_inflight("pod-0:8000", 1, 1_000, 0, 0)  # over the tight bound, under the loose one
    first = fc.submit(_item("1", clock))
    assert first.outcome is Outcome.DISPATCHED  # nothing waited: dispatched as without flow control
    pool.add_inflight("pod-0:8000", 1, 5_000, 0, 0)  # now over both
    fc.release(first)
    second = fc.submit(_item("2", clock))
    assert second.outcome is None
    pool.add_inflight("pod-0:8000", 0, -5_000, 0, 0)  # back to 1,000: under the loose bound only
    clock.advance(0.1)
    fc.service()
    assert second.outcome is None  # a request waits: the tight bound applies
    third = fc.submit(_item("3", clock))
    assert third.outcome is None  # behind a waiting request, a newcomer gets the tight bound too
    pool.add_inflight("pod-0:8000", 0, -900, 0, 0)  # 100 tokens in flight: under the tight bound
    fc.service()
    assert second.outcome is Outcome.DISPATCHED and third.outcome is None  # one per pump


def _lane_controller(pool: PoolState, clock: ManualClock) -> FlowController:
    """A prefill rate of 10,000 tok/s on every endpoint: bounds 5,000 tokens (loose, the lane's) and 500
    (while requests wait); the lane is priority ≥ 1."""
    detector = SaturationDetector(
        pool, SaturationThresholds(prefill_target_s=0.5, queued_prefill_target_s=0.05)
    )
    for endpoint in pool.endpoints:
        for _ in range(detector.prefill_rates.min_samples):
            detector.observe_first_token(endpoint.address, 10_000, 1.0)
    return FlowController(FlowQueues(fairness=RoundRobin), detector, clock, lane_min_priority=1)


def test_lane_room_uses_the_loose_prefill_bound_and_the_lane_kv_bound() -> None:
    pool = _pool(3)
    detector = _lane_controller(pool, ManualClock()).detector
    pool.add_inflight("pod-0:8000", 1, 1_000, 0, 0)  # over the tight bound, under the loose one
    pool.set_metrics("pod-1:8000", MetricsSnapshot(kv_usage=0.85), 0.0)  # over 0.8, under the lane's 0.9
    pool.set_metrics("pod-2:8000", MetricsSnapshot(kv_usage=0.95), 0.0)  # over both
    assert detector.room(contended=True) == 0
    assert detector.room(contended=True, lane=True) == 2
    assert detector.lane_mask(pool.healthy_positions()).tolist() == [True, True, False]


def test_the_lane_releases_the_top_band_while_the_others_wait() -> None:
    pool, clock = _pool(2), ManualClock()
    fc = _lane_controller(pool, clock)
    for endpoint in pool.endpoints:
        pool.add_inflight(endpoint.address, 1, 6_000, 0, 0)  # over both bounds
    standard = fc.submit(_item("standard", clock))
    for endpoint in pool.endpoints:
        pool.add_inflight(endpoint.address, 0, -5_000, 0, 0)  # lane room on both, no room otherwise
    fc.service()
    assert standard.outcome is None  # a standard request is not in the lane: it waits
    critical = fc.submit(_item("critical", clock, priority=1))
    assert critical.outcome is Outcome.DISPATCHED and critical.reason == "lane" and critical.lane
    assert standard.outcome is None and fc.reserved == 1
    second = fc.submit(_item("critical-2", clock, priority=2))
    assert second.outcome is Outcome.DISPATCHED and second.lane  # the other endpoint's lane room
    third = fc.submit(_item("critical-3", clock, priority=1))
    assert third.outcome is None  # lane room 2, both reserved
    for ticket in (critical, second):
        pool.add_inflight("pod-0:8000" if ticket is critical else "pod-1:8000", 1, 5_000, 0, 0)
        fc.release(ticket)
    assert third.outcome is None  # both endpoints over the loose bound now


def test_lane_tickets_only_while_others_wait() -> None:
    pool, clock = _pool(1), ManualClock()
    fc = _lane_controller(pool, clock)
    alone = fc.submit(_item("alone", clock, priority=1))
    assert alone.outcome is Outcome.DISPATCHED and alone.reason == "room" and not alone.lane
    pool.add_inflight("pod-0:8000", 1, 6_000, 0, 0)  # over both bounds
    fc.release(alone)
    waiting = [fc.submit(_item(f"w{i}", clock, priority=p)) for i, p in enumerate((0, 1))]
    assert all(t.outcome is None for t in waiting)
    pool.add_inflight("pod-0:8000", 0, -5_900, 0, 0)  # 100 tokens: room under the tight bound
    fc.service()
    critical = waiting[1]  # strict priority: the critical one goes first, and in the lane
    assert critical.outcome is Outcome.DISPATCHED and critical.reason == "room" and critical.lane
    assert waiting[0].outcome is None


def test_no_lane_without_a_lane_priority() -> None:
    pool, clock = _pool(1), ManualClock()
    fc = _lane_controller(pool, clock)
    fc.lane_min_priority = None
    pool.add_inflight("pod-0:8000", 1, 6_000, 0, 0)
    fc.submit(_item("standard", clock))
    pool.add_inflight("pod-0:8000", 0, -5_000, 0, 0)  # lane room, had there been a lane
    critical = fc.submit(_item("critical", clock, priority=1))
    assert critical.outcome is None and len(fc) == 2


def test_a_cap_learned_below_the_slot_cap_grows_with_what_the_engine_runs() -> None:
    pool = _pool(1)
    detector = SaturationDetector(pool, SaturationThresholds(queue_depth_threshold=5))
    pool.set_metrics("pod-0:8000", MetricsSnapshot(waiting=0, running=40), 0.0)
    assert detector.room() == math.inf and detector.cap("pod-0:8000") is None  # never made one wait
    # Long prompts wait on the prefill token budget with only 9 running: a cap far below the slots.
    pool.set_metrics("pod-0:8000", MetricsSnapshot(waiting=3, running=9), 1.0)
    pool.add_inflight("pod-0:8000", 14, 0, 0, 0)
    assert detector.room() == 0 and detector.cap("pod-0:8000") == 9
    # The engine runs all 14 (nothing waits): the cap follows, so the slot room opens again.
    pool.set_metrics("pod-0:8000", MetricsSnapshot(waiting=0, running=14), 2.0)
    assert detector.room() == 5 and detector.cap("pod-0:8000") == 14
    pool.set_metrics("pod-0:8000", MetricsSnapshot(waiting=0, running=2), 3.0)
    assert detector.cap("pod-0:8000") == 14  # the most it was seen running


def test_while_requests_wait_an_endpoint_holds_only_the_queued_depth_beyond_its_cap() -> None:
    pool = _pool(2)
    detector = SaturationDetector(pool, SaturationThresholds(queue_depth_threshold=5))
    assert detector.thresholds.queued_queue_depth_threshold == 1
    pool.set_metrics("pod-0:8000", MetricsSnapshot(waiting=2, running=14), 0.0)
    pool.add_inflight("pod-0:8000", 16, 0, 0, 0)
    pool.set_metrics("pod-1:8000", MetricsSnapshot(waiting=1, running=0, kv_usage=0.95), 0.0)
    assert detector.room() == 3  # pod-0: cap 14 + 5 − 16; pod-1: KV full
    assert detector.room(contended=True) == 0  # 14 + 1 − 16: its engine queue is long enough
    pool.add_inflight("pod-0:8000", -2, 0, 0, 0)
    assert detector.room(contended=True) == 1
    # The one above the cap lets a cap learned low grow while requests wait.
    pool.add_inflight("pod-0:8000", 1, 0, 0, 0)
    pool.set_metrics("pod-0:8000", MetricsSnapshot(waiting=0, running=15), 1.0)
    assert detector.room(contended=True) == 1 and detector.cap("pod-0:8000") == 15
    same = SaturationDetector(
        pool, SaturationThresholds(queue_depth_threshold=5, queued_queue_depth_threshold=None)
    )
    pool.set_metrics("pod-0:8000", MetricsSnapshot(waiting=1, running=15), 2.0)
    assert same.room(contended=True) == same.room() == 5  # cap 15 + 5 − 15


def test_the_queued_queue_depth_is_configured_by_name() -> None:
    assert FlowControlConfig().saturation_detector.thresholds().queued_queue_depth_threshold == 1
    section = FlowControlConfig.model_validate({"saturationDetector": {"queuedQueueDepthThreshold": None}})
    assert section.saturation_detector.thresholds().queued_queue_depth_threshold is None
    with pytest.raises(ValueError, match="queuedQueueDepthThreshold"):
        FlowControlConfig.model_validate({"saturationDetector": {"queuedQueueDepthThreshold": -1}})
