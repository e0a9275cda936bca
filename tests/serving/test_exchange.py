"""The exchange: one request's walk around the Director, as every front-end drives it (the front-ends' own
tests keep their protocol's behaviour)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from slorouter.api.requests import parse_chat_completion
from slorouter.api.routing_headers import parse_routing_headers
from slorouter.clock import ManualClock
from slorouter.config import HedgingConfig, ObjectiveConfig
from slorouter.director import Director
from slorouter.metrics import GatewayMetrics
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext, TargetPrediction, Termination
from slorouter.scheduling.types import SchedulingError
from slorouter.serving.exchange import MAX_KEPT_RESPONSE_BYTES, Exchange, FrontEnd
from slorouter.serving.slo_actions import HedgeOutcome, HedgeSkip, SloActions
from slorouter.tracing.config import TracingConfig
from slorouter.tracing.tracer import Tracing

ADDRESSES = ["10.0.0.1:8000", "10.0.0.2:8000"]
PATH = "/v1/chat/completions"
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello " * 40}]}).encode()


def _stream(tokens: int, completion: int) -> bytes:
    events = [b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'] * tokens
    usage = {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": completion}}
    return b"".join(events) + b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


@pytest.fixture
def front(clock: ManualClock) -> FrontEnd:
    pool = PoolState([Endpoint(a) for a in ADDRESSES])
    for address in ADDRESSES:
        pool.set_metrics(address, MetricsSnapshot(kv_usage=0.1), at=clock.now())
    setup = build_scheduler_setup(None, PluginContext(clock=clock, rng=np.random.default_rng(0), pool=pool))
    director = Director(pool, setup, InFlightTracker(pool), clock)
    return FrontEnd(director, "gateway", GatewayMetrics(pool))


def _exchange(front: FrontEnd, request_id: str | None = None) -> Exchange:
    exchange = front.exchange("POST", PATH)
    exchange.parsed(
        parse_chat_completion(BODY),
        parse_routing_headers({}, {}, prediction_by_default=False),
        {},
        request_id,
    )
    return exchange


def _count(front: FrontEnd, name: str, labels: dict[str, str] | None = None) -> float:
    assert front.metrics is not None
    return front.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def _inflight(front: FrontEnd) -> int:
    return int(front.director.pool.columns["inflight_requests"].sum())


async def test_a_streamed_answer_feeds_the_lifecycle_and_records_the_outcome(front, clock):
    exchange = _exchange(front)
    assert exchange.request is not None and exchange.request.request_id  # one was made
    await exchange.admit()
    lifecycle = await exchange.pick()
    assert _inflight(front) == 1
    assert exchange.started(200, True) and exchange.reads_body
    clock.advance(0.2)
    body = _stream(tokens=5, completion=4)
    exchange.chunk(body[:7])  # split anywhere
    exchange.chunk(body[7:])
    clock.advance(0.3)
    exchange.answered()
    response = lifecycle.response
    assert (response.cause, response.succeeded, response.tokens) == (Termination.COMPLETE, True, 4)
    assert response.first_token_at == pytest.approx(100.2)
    assert _inflight(front) == 0
    served = {"endpoint": lifecycle.target.address, "code": "200"}
    assert _count(front, "slorouter_requests_total", served) == 1
    exchange.answered(Termination.UPSTREAM_ERROR, "late")  # over: ignored
    exchange.abandoned(Termination.CLIENT_GONE, "late")
    assert response.cause is Termination.COMPLETE
    assert _count(front, "slorouter_client_disconnects_total") == 0


async def test_an_error_status_is_a_complete_answer_that_did_not_succeed(front):
    exchange = _exchange(front)
    lifecycle = await exchange.pick()
    assert not exchange.started(500, False)  # no reply text to read from an error body
    exchange.answered(body=b'{"error": {"message": "boom"}}')
    assert lifecycle.response.cause is Termination.COMPLETE
    assert not lifecycle.response.succeeded and not lifecycle.response.failed
    assert lifecycle.response.first_token_at is None  # no first token was served
    labels = {"endpoint": lifecycle.target.address, "code": "500"}
    assert _count(front, "slorouter_requests_total", labels) == 1


async def test_a_failed_attempt_is_left_out_of_the_next_pick_and_the_refusal_names_it(front):
    exchange = _exchange(front)
    first = await exchange.pick()
    exchange.failed(Termination.UPSTREAM_ERROR, "connect: refused", "connect")
    assert first.response.cause is Termination.UPSTREAM_ERROR and first.response.failed
    assert first.response.detail == "connect: refused"
    assert exchange.tried == [first.target.address]
    assert _inflight(front) == 0
    second = await exchange.pick()
    assert second.target.address != first.target.address
    assert _count(front, "slorouter_upstream_retries_total") == 1
    failure = {"endpoint": first.target.address, "phase": "connect"}
    assert _count(front, "slorouter_upstream_failures_total", failure) == 1
    exchange.failed(Termination.UPSTREAM_TIMEOUT, "read: timeout", "timeout")
    with pytest.raises(SchedulingError):  # every endpoint was tried
        await exchange.pick()
    exchange.refuse(504, "the model server did not answer in time")
    labels = {"endpoint": second.target.address, "code": "504"}
    assert _count(front, "slorouter_requests_total", labels) == 1
    exchange.refuse(502, "again")  # over: counted once
    assert _count(front, "slorouter_requests_total", {"endpoint": second.target.address, "code": "502"}) == 0


async def test_a_client_that_leaves_mid_stream_ends_the_request_and_is_counted(front):
    exchange = _exchange(front)
    lifecycle = await exchange.pick()
    exchange.started(200, True)
    exchange.chunk(_stream(tokens=2, completion=2)[:60])
    exchange.abandoned(Termination.CLIENT_GONE, "client disconnected")
    assert lifecycle.response.cause is Termination.CLIENT_GONE
    assert _inflight(front) == 0
    assert _count(front, "slorouter_client_disconnects_total") == 1
    # No answer reached the client: no outcome is counted for the endpoint.
    assert (
        _count(front, "slorouter_requests_total", {"endpoint": lifecycle.target.address, "code": "200"}) == 0
    )


async def test_a_whole_body_is_kept_bounded_for_the_reply_text_the_plugins_asked_for(front):
    # The default pipeline's prefix producer indexes replies: it asks for the reply's start.
    exchange = _exchange(front)
    lifecycle = await exchange.pick()
    assert lifecycle.reply_chars_wanted > 0
    assert not exchange.started(200, False, keeps_body=False)  # a front-end that reads the body itself
    keeping = _exchange(front)
    lifecycle = await keeping.pick()
    assert keeping.started(200, False) and keeping.reads_body
    keeping.chunk(b"x" * (MAX_KEPT_RESPONSE_BYTES + 1))  # too long to keep: dropped, not grown
    assert not keeping.reads_body
    keeping.answered()
    assert lifecycle.response.reply_text is None
    assert lifecycle.response.cause is Termination.COMPLETE


async def test_the_data_plane_serving_elsewhere_moves_the_load_and_the_facts(front):
    exchange = _exchange(front)
    lifecycle = await exchange.pick()
    picked = lifecycle.target.address
    other = next(a for a in ADDRESSES if a != picked)
    assert exchange.facts is not None and exchange.facts.endpoint == picked
    assert exchange.served_by(other)
    assert lifecycle.target.address == other
    assert dict(exchange.facts.headers())["x-slorouter-endpoint"] == other
    assert not exchange.served_by(other)  # already there
    assert not exchange.served_by("10.9.9.9:1")  # not in the pool


def _traced(front: FrontEnd) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    config = TracingConfig.model_validate({"enabled": True, "sampling": {"samplerArg": 1.0}})
    front.tracing = Tracing.build(config, exporter)
    return exporter


async def test_spans_follow_the_exchange_to_its_end(front):
    exporter = _traced(front)
    exchange = _exchange(front)
    lifecycle = await exchange.pick()
    assert "traceparent" in exchange.upstream_context(lifecycle.target.address)
    exchange.started(200, True)
    exchange.chunk(_stream(tokens=3, completion=3))
    exchange.answered()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"slorouter.request", "slorouter.schedule", "slorouter.upstream"}
    root = dict(spans["slorouter.request"].attributes or {})
    assert root["slorouter.endpoint"] == lifecycle.target.address
    assert root["http.response.status_code"] == 200
    assert root["slorouter.termination"] == "complete"
    assert dict(spans["slorouter.upstream"].attributes or {})["slorouter.output_tokens"] == 3


async def test_spans_say_how_a_failed_attempt_and_an_abandoned_request_ended(front):
    exporter = _traced(front)
    exchange = _exchange(front)
    first = await exchange.pick()
    exchange.upstream_context(first.target.address)
    exchange.failed(Termination.UPSTREAM_TIMEOUT, "read: timeout", "timeout")
    await exchange.pick()
    exchange.abandoned(Termination.CLIENT_GONE, "client disconnected")
    spans = exporter.get_finished_spans()
    failed = next(span for span in spans if span.name == "slorouter.upstream")
    root = next(span for span in spans if span.name == "slorouter.request")
    assert dict(failed.attributes or {})["slorouter.termination"] == "upstream-timeout"
    assert dict(root.attributes or {})["slorouter.termination"] == "client-gone"


@pytest.mark.parametrize(("status", "error"), [(429, False), (502, True)])
async def test_a_refusal_ends_the_span_as_a_server_error_only_for_5xx(front, status, error):
    exporter = _traced(front)
    _exchange(front).refuse(status, "no")
    (root,) = exporter.get_finished_spans()
    assert dict(root.attributes or {})["http.response.status_code"] == status
    assert (root.status.status_code is StatusCode.ERROR) is error


def test_the_benchmark_drives_tokens_without_bytes(front, clock):
    request = _exchange(front).request
    assert request is not None
    exchange = Exchange.of(FrontEnd(front.director, "bench"), request)
    lifecycle = exchange.pick_now()
    assert not exchange.started(200, True, bytes_follow=False)
    clock.advance(0.1)
    exchange.tokens(1)
    exchange.answered(usage={"completion_tokens": 7})
    assert (lifecycle.response.tokens, lifecycle.response.cause) == (7, Termination.COMPLETE)
    assert lifecycle.response.first_token_at == pytest.approx(100.1)


def _hedging(front: FrontEnd, **hedging: float) -> SloActions:
    objectives = {"chat": ObjectiveConfig(priority=1, deadline={"action": "hedge"})}
    actions = SloActions(objectives, HedgingConfig(max_slo_share=0.5, min_delay_ms=0, **hedging))
    front.actions = actions
    actions.watch_stalls(front.director.tracker)
    return actions


def _planned(front: FrontEnd) -> Exchange:
    exchange = front.exchange("POST", PATH)
    hints = parse_routing_headers(
        {"x-gateway-inference-objective": "chat", "x-slo-ttft-ms": "400"},
        {"chat": 1},
        prediction_by_default=False,
    )
    exchange.parsed(parse_chat_completion(BODY), hints, {}, None)
    return exchange


async def test_a_hedge_the_data_plane_sends_is_armed_at_the_pick_and_a_win_moves_the_request(front, clock):
    actions = _hedging(front, burst=2)
    exchange = _planned(front)
    lifecycle = await exchange.pick()
    picked = lifecycle.target.address
    prefill = lifecycle.prefill_tokens
    due = exchange.hedge_delegated(1)
    assert due == pytest.approx(100.2)  # half the 400 ms SLO after the request came
    assert actions.budget.level == pytest.approx(1.0)  # taken now
    clock.advance(0.25)
    other = next(a for a in ADDRESSES if a != picked)
    # Served elsewhere after the delay: the copy won (an attempt count, when given, agrees).
    assert exchange.data_plane_answered(other, None, failed=False) is HedgeOutcome.WON
    assert lifecycle.target.address == other and exchange.tried == [picked]
    assert lifecycle.response.dispatched_at == pytest.approx(100.2)  # measured from the copy's dispatch
    assert _inflight(front) == 1  # the load followed the copy
    assert actions.hedges["chat", HedgeOutcome.SENT] == actions.hedges["chat", HedgeOutcome.WON] == 1
    assert actions.loser_prefill_tokens == prefill
    assert exchange.data_plane_answered(other, 2, failed=False) is None  # settled once


@pytest.mark.parametrize(
    ("wait_s", "attempts", "failed", "outcome"),
    [
        (0.1, 1, False, None),  # answered before the hedge was due
        (0.3, 1, False, None),  # late, but the data plane made one attempt: no copy went
        (0.1, 2, False, None),  # a retry after a failed connection, before the hedge was due
        (0.3, 2, False, HedgeOutcome.LOST),  # the pick answered after the copy went out
        (0.3, 2, True, HedgeOutcome.FAILED),  # the data plane's own answer: both attempts failed
        (0.3, None, False, None),  # no attempt count, the pick answered: maybe no copy went, none counted
    ],
)
async def test_what_the_response_says_of_a_hedge_the_data_plane_was_armed_for(
    front, clock, wait_s, attempts, failed, outcome
):
    actions = _hedging(front, burst=2)
    exchange = _planned(front)
    lifecycle = await exchange.pick()
    assert exchange.hedge_delegated(1) is not None
    clock.advance(wait_s)
    assert exchange.data_plane_answered(lifecycle.target.address, attempts, failed) is outcome
    sent = actions.hedges["chat", HedgeOutcome.SENT]
    assert sent == (outcome is not None)
    assert actions.budget.level == pytest.approx(1.0 if sent else 2.0)  # not sent: given back


async def test_an_armed_hedge_of_a_request_that_ends_early_is_given_back_and_after_its_delay_cancelled(
    front, clock
):
    actions = _hedging(front, burst=3)
    for wait_s, sent in ((0.1, 0), (0.3, 1)):
        exchange = _planned(front)
        await exchange.pick()
        assert exchange.hedge_delegated(1) is not None
        clock.advance(wait_s)
        exchange.abandoned(Termination.CLIENT_GONE, "client disconnected")
        assert actions.hedges["chat", HedgeOutcome.CANCELLED] == sent
    assert actions.budget.level == pytest.approx(2.0)  # one hedge spent, the other given back


async def test_no_hedge_is_armed_beyond_the_budget_or_without_another_endpoint(front):
    actions = _hedging(front, max_share=0.001, burst=1)
    exchange = _planned(front)
    await exchange.pick()
    assert exchange.hedge_delegated(0) is None  # the data plane would send the copy to the pick again
    assert actions.skipped["chat", HedgeSkip.NO_ENDPOINT] == 1
    assert actions.budget.level == pytest.approx(1.0)  # not taken
    assert exchange.hedge_delegated(1) is not None
    exchange = _planned(front)
    await exchange.pick()
    assert exchange.hedge_delegated(1) is None
    assert actions.skipped["chat", HedgeSkip.BUDGET] == 1


def _predicted(front: FrontEnd, copy_ms: float) -> None:
    """The copy's pick predicts ``copy_ms`` for its endpoint (the default pipeline predicts nothing)."""
    director = front.director
    schedule = director.schedule_async

    async def predicted_schedule(*args, **kwargs):
        result = await schedule(*args, **kwargs)
        result.primary.predicted_ttft_ms = [copy_ms]
        return result

    director.schedule_async = predicted_schedule  # type: ignore[method-assign]


async def test_a_copy_predicted_to_answer_after_its_request_is_held_back_once_until_it_would_not(
    front, clock
):
    actions = _hedging(front, burst=2)
    _predicted(front, copy_ms=80.0)
    exchange = _planned(front)
    lifecycle = await exchange.pick()
    lifecycle.prediction = TargetPrediction(100.0)
    assert exchange.hedge_at() == pytest.approx(100.15)  # 1.5 × the 100 ms predicted
    clock.advance(0.15)
    assert await exchange.hedge() is None  # overdue by 50 ms, the copy needs 80 ms
    assert exchange.hedge_at() == pytest.approx(100.18)
    clock.advance(0.03)
    copy = await exchange.hedge()
    assert copy is not None and copy.target.address != lifecycle.target.address
    assert actions.hedges["chat", HedgeOutcome.SENT] == 1 and exchange.hedge_at() is None
    assert actions.stall_hedges["chat"] == 0


async def test_a_request_on_a_stalled_endpoint_is_hedged_before_its_delay_and_not_to_a_stalled_one(
    front, clock
):
    actions = _hedging(front, stall_ms=500)
    exchange = _planned(front)
    lifecycle = await exchange.pick()
    lifecycle.prediction = TargetPrediction(2000.0)  # its hedge is due in 3 s
    address = lifecycle.target.address
    tracker = front.director.tracker
    other = tracker.dispatch(address, 50, 10)  # another request decodes there
    other.first_token()
    tracker.progressed(address, clock.now())
    assert exchange.hedge_at() == pytest.approx(100.25)  # looked at every 250 ms
    clock.advance(0.25)
    assert await exchange.hedge() is None  # 250 ms without a token: not stalled yet
    assert exchange.hedge_at() == pytest.approx(100.5)
    clock.advance(0.25)
    copy = await exchange.hedge()  # 500 ms: stalled, hedged at once
    assert copy is not None and copy.target.address != address
    assert actions.hedges["chat", HedgeOutcome.SENT] == actions.stall_hedges["chat"] == 1
    assert address in exchange._hedge_excluded()
    other.finish()
