"""The router's window of recent traffic: what it keeps of each answered request, and its bounds."""

from __future__ import annotations

import math

import pytest

from slorouter.scheduling.plugin import Termination
from slorouter.serving.traffic_window import BLOCK_BYTES, TrafficWindow
from tests.helpers.scheduling import make_director, make_pool, make_request


def answer(director, window, prompt, *, at, tokens=5, stream=True, cause=Termination.COMPLETE, **fields):
    """One request through ``director`` at ``at``: first token 0.1 s later, one token every 10 ms after."""
    clock = director.clock
    clock.set(at)
    request = make_request(prompt, received_at=at, stream=stream, **fields)
    lifecycle = director.dispatch(request, director.schedule(request))
    lifecycle.on_headers(200, streaming=stream)
    clock.set(at + 0.1)
    lifecycle.on_tokens(1)
    clock.set(at + 0.1 + 0.01 * (tokens - 1))
    lifecycle.on_tokens(tokens - 1)
    lifecycle.end(cause)
    window.answered(lifecycle, waiting=2.0, running=7.0)
    return lifecycle


def test_an_entry_holds_the_requests_numbers_and_outcome_but_no_text():
    director = make_director(make_pool(2))
    window = TrafficWindow()
    prompt = "x" * (3 * BLOCK_BYTES + 10)
    lifecycle = answer(director, window, prompt, at=5.0, tokens=11, slo_ttft_ms=300.0, priority=-1)
    (entry,) = window.entries()
    assert entry.arrival == 5.0 and entry.prompt_tokens == len(prompt) // 4 and entry.output_tokens == 11
    assert len(entry.block_hashes) == 3  # whole blocks only
    assert entry.ttft_ms == pytest.approx(100.0) and entry.tpot_ms == pytest.approx(10.0)
    assert entry.slo_ttft_ms == 300.0 and entry.priority == -1 and entry.stream
    assert entry.endpoint == lifecycle.target.address and entry.profile == "default"
    assert (entry.waiting, entry.running) == (2.0, 7.0)
    assert not any(isinstance(v, str) and "x" in v for v in (entry.endpoint, entry.profile))


def test_shared_prefixes_share_leading_hashes():
    director = make_director(make_pool(2))
    window = TrafficWindow()
    system = "s" * (2 * BLOCK_BYTES)
    answer(director, window, system + "a" * BLOCK_BYTES, at=0.0)
    answer(director, window, system + "b" * BLOCK_BYTES, at=1.0)
    first, second = window.entries()
    assert first.block_hashes[:2] == second.block_hashes[:2]
    assert first.block_hashes[2] != second.block_hashes[2]


def test_a_failed_request_has_no_latencies():
    director = make_director(make_pool(1))
    window = TrafficWindow()
    answer(director, window, "p" * 100, at=0.0, cause=Termination.UPSTREAM_ERROR)
    (entry,) = window.entries()
    assert entry.ttft_ms is None and entry.tpot_ms is None


def test_the_window_keeps_its_span_and_count():
    director = make_director(make_pool(1))
    by_age = TrafficWindow(span_s=10.0)
    for t in range(30):
        answer(director, by_age, "p" * 100, at=float(t))
    assert [e.arrival for e in by_age.entries()] == [float(t) for t in range(19, 30)]
    assert [e.arrival for e in by_age.entries(since=25.0)] == [25.0, 26.0, 27.0, 28.0, 29.0]
    director = make_director(make_pool(1))
    by_count = TrafficWindow(max_entries=4)
    for t in range(30):
        answer(director, by_count, "p" * 100, at=float(t))
    assert len(by_count) == 4


@pytest.mark.parametrize(("span", "count"), [(0.0, 10), (-1.0, 10), (math.nan, 10), (10.0, 0)])
def test_bad_bounds_are_refused(span, count):
    with pytest.raises(ValueError, match="span_s"):
        TrafficWindow(span_s=span, max_entries=count)
