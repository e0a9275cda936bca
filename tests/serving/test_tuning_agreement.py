"""Pickers that share in-flight load agree on one candidate: the smallest id leads, the others follow."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import msgspec
from prometheus_client import CollectorRegistry

from slorouter.clock import ManualClock
from slorouter.config import TuningConfig
from slorouter.pool.inflight_sharing import decode, encode
from slorouter.pool.shared_inflight import InFlightPublication, SharedInFlightBoard, SharedInFlightView
from slorouter.scheduling.pipelines import SELF_TUNING_SCHEDULER_CONFIG
from slorouter.serving.self_tuning import SelfTuning
from tests.helpers.scheduling import make_director, make_pool


def picker(name: str, clock: ManualClock):
    pool = make_pool(2)
    director = make_director(pool, copy.deepcopy(SELF_TUNING_SCHEDULER_CONFIG))
    switch = director.setup.candidate_switch
    assert switch is not None
    tuning = SelfTuning(
        TuningConfig(enabled=True),
        switch,
        pool,
        clock,
        CollectorRegistry(),
        pipeline=SELF_TUNING_SCHEDULER_CONFIG,
    )
    sharing = SimpleNamespace(
        view=SharedInFlightView(pool, name, epoch=1), board=SharedInFlightBoard(0.5, clock)
    )
    tuning.agree(sharing)  # type: ignore[arg-type]
    return tuning, sharing


def exchange(*pickers) -> None:
    """Every picker's publication reaches every other one's board."""
    for _, sender in pickers:
        publication = decode(encode(sender.view.publication()))  # through the wire format
        for _, receiver in pickers:
            if receiver is not sender:
                receiver.board.receive(publication)


async def test_the_smallest_id_leads_and_the_others_follow_its_candidate():
    clock = ManualClock(0.0)
    a, a_sharing = picker("picker-a", clock)
    b, b_sharing = picker("picker-b", clock)
    exchange((a, a_sharing), (b, b_sharing))
    assert a.leader() == (True, None, 2)
    assert b.leader() == (False, "predicted-latency", 2)
    a.switch.activate("token-aware")
    exchange((a, a_sharing), (b, b_sharing))
    assert b.switch.active == "predicted-latency"  # until it follows
    assert b._follow() and b.switch.active == "token-aware"
    assert b.metrics.switches.labels("token-aware", "leader")._value.get() == 1
    assert await b.round() == 0.0 and b._process is None  # a follower never starts a tuner
    assert b.status().last_round == {"reason": "following the leading picker"}


async def test_when_the_leader_goes_the_next_picker_leads():
    clock = ManualClock(0.0)
    a, a_sharing = picker("picker-a", clock)
    b, b_sharing = picker("picker-b", clock)
    exchange((a, a_sharing), (b, b_sharing))
    assert not b.leader()[0]
    clock.set(1.0)  # picker-a published nothing for longer than the TTL
    assert b.leader() == (True, None, 1)


def test_a_publication_without_a_candidate_still_decodes():
    class OldWire(msgspec.Struct, array_like=True):
        picker: str
        epoch: int
        seq: int
        counts: dict[str, tuple[int, int, int, int]]

    old = msgspec.msgpack.encode(OldWire("p", 1, 2, {"a:1": (1, 2, 3, 4)}))
    assert decode(old) == InFlightPublication("p", 1, 2, {"a:1": (1, 2, 3, 4)}, "")
