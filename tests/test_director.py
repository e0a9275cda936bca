"""The Director: the request lifecycle shared by every front-end."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from slorouter.api.replies import CHAT, TEXT
from slorouter.clock import ManualClock
from slorouter.director import Admission, Director
from slorouter.flowcontrol.config import FlowControlConfig
from slorouter.flowcontrol.controller import Ticket
from slorouter.flowcontrol.types import Outcome
from slorouter.metrics import LatencyMetrics
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import (
    DataProducer,
    PluginContext,
    PreRequest,
    PreRequestResult,
    ResponseBodyProcessor,
    ResponseInfo,
    TargetPrediction,
    Termination,
)
from slorouter.scheduling.types import InferenceRequest, NoCandidatesError, PickReason

ADDRESSES = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]


class BrokenProducer:
    def produce(self, request, candidates):
        raise RuntimeError("boom")


class RecordingBodyProcessor(ResponseBodyProcessor):
    def __init__(self) -> None:
        self.calls: list[tuple[bool, bool, int]] = []

    def on_response_body(self, request, response: ResponseInfo, *, start_of_stream, end_of_stream):
        self.calls.append((start_of_stream, end_of_stream, response.tokens))


@pytest.fixture
def director() -> Director:
    clock = ManualClock(100.0)
    pool = PoolState([Endpoint(a) for a in ADDRESSES])
    for address in ADDRESSES:
        pool.set_metrics(address, MetricsSnapshot(kv_usage=0.1), at=clock.now())
    setup = build_scheduler_setup(None, PluginContext(clock=clock, rng=np.random.default_rng(0), pool=pool))
    return Director(pool, setup, InFlightTracker(pool), clock)


def _request(i: int = 0) -> InferenceRequest:
    return InferenceRequest(f"r{i}", "m", f"prompt {i} " * 30, prompt_tokens=100, max_tokens=20)


def test_excluded_and_unhealthy_endpoints_are_never_picked(director):
    director.pool.set_healthy(ADDRESSES[2], False)
    for i in range(20):
        assert director.schedule(_request(i), exclude={ADDRESSES[0]}).target.address == ADDRESSES[1]


def test_no_candidates_is_a_503(director):
    with pytest.raises(NoCandidatesError) as info:
        director.schedule(_request(), exclude=set(ADDRESSES))
    assert info.value.status == 503
    assert info.value.headers["Retry-After"]


def test_a_broken_producer_degrades_routing_not_availability(director):
    director.setup.data_producers.append(BrokenProducer())
    assert director.schedule(_request()).target.address in ADDRESSES


def test_lifecycle_accounts_in_flight_load_and_releases_it_once(director):
    recorder = RecordingBodyProcessor()
    director.setup.response_body_processors.append(recorder)
    request = _request()
    result = director.schedule(request)
    lifecycle = director.dispatch(request, result)
    address = result.target.address
    pool = director.pool
    assert pool.value(address, "inflight_requests") == 1
    assert pool.value(address, "inflight_prefill_tokens") == 100

    director.clock.advance(0.05)
    lifecycle.on_headers(200, streaming=True)
    lifecycle.on_tokens(1)
    assert lifecycle.response.first_token_at == pytest.approx(100.05)
    assert pool.value(address, "inflight_prefill_tokens") == 0
    assert pool.value(address, "inflight_decode_tokens") == 120
    lifecycle.on_tokens(2)

    director.clock.advance(0.1)
    lifecycle.end(usage={"completion_tokens": 20})
    lifecycle.end(Termination.UPSTREAM_ERROR, detail="again")  # ignored: the first completion counts
    assert lifecycle.response.tokens == 20
    assert lifecycle.response.cause is Termination.COMPLETE
    assert lifecycle.response.completed_at == pytest.approx(100.15)
    for column in ("inflight_requests", "inflight_prefill_tokens", "inflight_decode_tokens"):
        assert pool.value(address, column) == 0
    assert recorder.calls == [(True, False, 1), (False, False, 3), (False, True, 20)]
    assert director.tracker.outstanding() == 0


def test_the_servers_usage_count_wins_over_the_events_counted(director):
    """A stream has events without a token (llama-server's chat stream: the role event, the closing event
    with finish_reason only, the usage event): 3 tokens came in 6 events, and usage says 3. The output
    tokens, which the TPOT observations divide by, are the server's count, larger or smaller."""
    recorder = RecordingBodyProcessor()
    director.setup.response_body_processors.append(recorder)
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    lifecycle.on_headers(200, streaming=True)
    for _ in range(6):
        lifecycle.on_tokens(1)
    lifecycle.end(usage={"completion_tokens": 3, "prompt_tokens": 25})
    assert lifecycle.response.tokens == 3
    assert recorder.calls[-1] == (False, True, 3)

    for usage, tokens in (({"completion_tokens": 9}, 9), ({"completion_tokens": True}, 2), ({}, 2)):
        request = _request()
        lifecycle = director.dispatch(request, director.schedule(request))
        lifecycle.on_tokens(2)
        lifecycle.end(usage=usage)
        assert lifecycle.response.tokens == tokens, usage  # a count that is no integer is not one


def test_failure_before_first_token_releases_prefill(director):
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    lifecycle.end(Termination.UPSTREAM_ERROR, detail="connect: refused")
    assert lifecycle.response.first_token_at is None
    assert int(director.pool.columns["inflight_prefill_tokens"].sum()) == 0
    assert int(director.pool.columns["inflight_requests"].sum()) == 0


def test_a_repeated_prompt_is_pending_prefill_only_where_it_is_not_cached(director):
    """The default pipeline's prefix producer marks what the target already holds; the in-flight prefill of
    that endpoint leaves it out, while the decode phase still counts the whole prompt."""
    first = _request()
    director.dispatch(first, director.schedule(first)).end(usage={"completion_tokens": 20})
    again = _request()  # the same prompt: the endpoint that served it holds all of its blocks
    result = director.schedule(again)
    lifecycle = director.dispatch(again, result)
    address = result.target.address
    assert director.pool.value(address, "inflight_prefill_tokens") == 0
    lifecycle.on_tokens(1)
    assert director.pool.value(address, "inflight_decode_tokens") == 120
    lifecycle.end()
    assert director.tracker.outstanding() == 0


class SlowProducer(DataProducer):
    """Waits on "I/O" for ``delay_s``, then attaches its data."""

    produces = ("slow",)

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.finished = False
        self.cancelled = False

    def produce(self, request, candidates):
        return self._fetch(candidates)

    async def _fetch(self, candidates) -> None:
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        candidates.attrs["slow"] = np.ones(len(candidates))
        self.finished = True


class CountingProducer(DataProducer):
    def __init__(self) -> None:
        self.calls = 0

    def produce(self, request, candidates):
        self.calls += 1
        return None


async def test_an_async_producer_is_awaited_within_the_budget(director):
    producer = SlowProducer(0.001)
    director.setup.data_producers.append(producer)
    result = await director.schedule_async(_request())
    assert producer.finished and result.target.address in ADDRESSES


async def test_a_producer_past_the_budget_is_cancelled_and_scheduling_goes_on(director):
    director.latency_metrics = LatencyMetrics(CollectorRegistry())
    director.setup.data_producer_timeout_s = 0.02
    slow = SlowProducer(30.0)
    director.setup.data_producers.append(slow)
    result = await director.schedule_async(_request())
    assert result.target.address in ADDRESSES
    assert slow.cancelled and not slow.finished
    assert director.latency_metrics.producer_skips.labels(repr(slow))._value.get() == 1


async def test_producers_after_a_spent_budget_are_skipped(director):
    clock: ManualClock = director.clock  # type: ignore[assignment]
    director.setup.data_producer_timeout_s = 0.4

    class TimeEater(DataProducer):
        def produce(self, request, candidates):
            clock.advance(0.5)  # a synchronous producer that took longer than the whole budget
            return None

    later = CountingProducer()
    director.setup.data_producers[:] = [TimeEater(), later]
    assert (await director.schedule_async(_request())).target.address in ADDRESSES
    assert later.calls == 0


def test_schedule_without_a_loop_refuses_a_producer_that_waits(director):
    director.setup.data_producers.append(SlowProducer(0.001))
    with pytest.raises(RuntimeError, match="waits on I/O"):
        director.schedule(_request())


class PredictingHook(PreRequest):
    def __init__(self, result: PreRequestResult | None) -> None:
        self.result = result

    def pre_request(self, request, result):
        return self.result


def test_pre_request_results_reach_the_lifecycle(director):
    """The prediction is the first one given; the cached prompt tokens the largest (bounded by the prompt)."""
    director.setup.pre_request[:] = [
        PredictingHook(None),
        PredictingHook(PreRequestResult(cached_prompt_tokens=30, prediction=TargetPrediction(12.5, 3.0))),
        PredictingHook(PreRequestResult(cached_prompt_tokens=500, prediction=TargetPrediction(99.0))),
    ]
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    assert lifecycle.prediction == TargetPrediction(12.5, 3.0)
    address = lifecycle.target.address
    assert director.pool.value(address, "inflight_prefill_tokens") == 0  # min(500, prompt 100) cached


class ReplyReader(ResponseBodyProcessor):
    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.histories: list[str | None] = []

    def reply_chars_wanted(self, request):
        return self.wanted

    def on_response_body(self, request, response: ResponseInfo, *, start_of_stream, end_of_stream):
        if end_of_stream:
            self.histories.append(response.history_text)


def test_the_reply_is_collected_for_the_plugin_that_wants_most_and_becomes_the_history(director):
    small, large = ReplyReader(10), ReplyReader(80)
    director.setup.response_body_processors[:] = [small, large]
    request = _request()
    request.history_form = TEXT
    lifecycle = director.dispatch(request, director.schedule(request))
    assert lifecycle.reply_chars_wanted == 80
    lifecycle.on_reply_text("Hello")
    lifecycle.on_reply_text(", world")
    lifecycle.end()
    assert small.histories == large.histories == [request.prompt_text + "Hello, world"]


def test_chat_history_appends_the_assistant_message(director):
    reader = ReplyReader(100)
    director.setup.response_body_processors[:] = [reader]
    request = InferenceRequest("c", "m", '[{"role":"user","content":"hi"}]', 5, 5, history_form=CHAT)
    lifecycle = director.dispatch(request, director.schedule(request))
    lifecycle.on_reply_text("yo")
    lifecycle.end()
    # What the next turn's messages JSON starts with: it goes on with the next user message.
    assert reader.histories == ['[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}']


def test_no_reply_is_wanted_or_kept_when_the_prompt_cannot_be_continued_or_the_request_failed(director):
    reader = ReplyReader(100)
    director.setup.response_body_processors[:] = [reader]
    request = _request()  # history_form "": e.g. n > 1
    lifecycle = director.dispatch(request, director.schedule(request))
    assert lifecycle.reply_chars_wanted == 0
    lifecycle.on_reply_text("ignored")
    lifecycle.end()
    failed = _request(1)
    failed.history_form = TEXT
    broken = director.dispatch(failed, director.schedule(failed))
    broken.on_reply_text("partial")
    broken.end(Termination.UPSTREAM_ERROR, detail="stream: reset")
    assert reader.histories == [None, None]


def _lane_director(pick: str) -> tuple[Director, Admission, Admission]:
    """A director with flow control's priority lane; a lane admission and one outside the lane."""
    clock = ManualClock(100.0)
    pool = PoolState([Endpoint(a) for a in ADDRESSES])
    pool.set_metrics(ADDRESSES[0], MetricsSnapshot(kv_usage=0.95), at=clock.now())  # no lane room
    for address in ADDRESSES[1:]:
        pool.set_metrics(address, MetricsSnapshot(kv_usage=0.1), at=clock.now())
    pool.add_inflight(ADDRESSES[1], 3, 300, 0, 0)
    pool.add_inflight(ADDRESSES[2], 1, 900, 0, 0)
    setup = build_scheduler_setup(None, PluginContext(clock=clock, rng=np.random.default_rng(0), pool=pool))
    flow = FlowControlConfig.model_validate({"enabled": True, "priorityLane": {"pick": pick}})
    controller = flow.build(pool, clock)
    director = Director(pool, setup, InFlightTracker(pool), clock, flow_control=controller)
    item = controller.queued_request(_request())
    lane = Admission(controller, Ticket(item, outcome=Outcome.DISPATCHED, lane=True))
    other = Admission(controller, Ticket(item, outcome=Outcome.DISPATCHED))
    return director, lane, other


def test_a_lane_request_goes_to_the_least_loaded_endpoint_with_lane_room():
    director, lane, other = _lane_director("least-loaded")
    for i in range(10):
        assert director.schedule(_request(i), admission=lane).target.address == ADDRESSES[2]
    assert (
        director.schedule(_request(), exclude={ADDRESSES[2]}, admission=lane).target.address == (ADDRESSES[1])
    )
    picked = {director.schedule(_request(i), admission=other).target.address for i in range(30)}
    assert ADDRESSES[1] in picked  # outside the lane the scheduler's pick stands


def test_a_lane_request_with_the_scheduler_pick_avoids_endpoints_without_lane_room():
    director, lane, _ = _lane_director("scheduler")
    picked = {director.schedule(_request(i), admission=lane).target.address for i in range(30)}
    assert picked and ADDRESSES[0] not in picked
    only = director.schedule(_request(), exclude=set(ADDRESSES[1:]), admission=lane)
    assert only.target.address == ADDRESSES[0]  # no candidate has lane room: all of them stay


def test_a_lane_that_narrowed_the_candidates_is_the_picks_reason():
    director, lane, other = _lane_director("scheduler")
    director.record_picks = True
    lane_record = director.schedule(_request(), admission=lane).record
    assert lane_record is not None and lane_record.reason is PickReason.LANE
    assert len(lane_record) == len(ADDRESSES) - 1  # measured among the endpoints with lane room
    other_record = director.schedule(_request(), admission=other).record
    assert other_record is not None and other_record.reason is not PickReason.LANE
