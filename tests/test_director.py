"""The Director: the request lifecycle shared by every front-end."""

from __future__ import annotations

import numpy as np
import pytest

from slorouter.clock import ManualClock
from slorouter.director import Director
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.scheduling.config import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext, ResponseBodyProcessor, ResponseInfo
from slorouter.scheduling.types import InferenceRequest, NoCandidatesError

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
    lifecycle.on_complete(usage={"completion_tokens": 20})
    lifecycle.on_complete(error="again")  # ignored: the first completion counts
    assert lifecycle.response.tokens == 20
    assert lifecycle.response.error is None
    assert lifecycle.response.completed_at == pytest.approx(100.15)
    for column in ("inflight_requests", "inflight_prefill_tokens", "inflight_decode_tokens"):
        assert pool.value(address, column) == 0
    assert recorder.calls == [(True, False, 1), (False, False, 3), (False, True, 20)]
    assert director.tracker.outstanding() == 0


def test_failure_before_first_token_releases_prefill(director):
    request = _request()
    lifecycle = director.dispatch(request, director.schedule(request))
    lifecycle.on_complete(error="connect: refused")
    assert lifecycle.response.first_token_at is None
    assert int(director.pool.columns["inflight_prefill_tokens"].sum()) == 0
    assert int(director.pool.columns["inflight_requests"].sum()) == 0


def test_a_repeated_prompt_is_pending_prefill_only_where_it_is_not_cached(director):
    """The default pipeline's prefix producer marks what the target already holds; the in-flight prefill of
    that endpoint leaves it out, while the decode phase still counts the whole prompt."""
    first = _request()
    director.dispatch(first, director.schedule(first)).on_complete(usage={"completion_tokens": 20})
    again = _request()  # the same prompt: the endpoint that served it holds all of its blocks
    result = director.schedule(again)
    lifecycle = director.dispatch(again, result)
    address = result.target.address
    assert again.cached_prompt_tokens == 100
    assert director.pool.value(address, "inflight_prefill_tokens") == 0
    lifecycle.on_tokens(1)
    assert director.pool.value(address, "inflight_decode_tokens") == 120
    lifecycle.on_complete()
    assert director.tracker.outstanding() == 0
