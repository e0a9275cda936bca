"""The router status page: what ``RouterStats`` keeps of finished requests, the typed payload and its
JSON (the front-ends serve it: tests/gateway/test_status_page.py, tests/extproc/test_status_page.py)."""

from __future__ import annotations

import json

import pytest

from slorouter.clock import ManualClock
from slorouter.pool.kv_trust import KVTrustBoard, TrustReason, TrustState
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.predictor.live_check import LiveCheck
from slorouter.predictor.warm_start import Refusal, WarmStartReport
from slorouter.serving.status import (
    STATUS_SCHEMA,
    KVIndexStatus,
    NotAStatusPageError,
    RouterStats,
    decode_status,
    encode_status,
)


def _pool(clock: ManualClock) -> PoolState:
    pool = PoolState([Endpoint("10.0.0.1:8000"), Endpoint("10.0.0.2:8000"), Endpoint("10.0.0.3:8000")])
    pool.set_metrics("10.0.0.1:8000", MetricsSnapshot(waiting=3, running=5, kv_usage=0.25), clock.now())
    pool.add_inflight("10.0.0.1:8000", 2, 100, 0)
    pool.set_healthy("10.0.0.3:8000", False)
    return pool


def test_the_payload_holds_the_pool_and_the_finished_requests():
    clock = ManualClock(100.0)
    stats = RouterStats(clock, window=2)
    pool = _pool(clock)
    clock.advance(1.5)
    stats.record("10.0.0.1:8000", "predicted", predicted_ttft_ms=90, observed_ttft_ms=100, slo_met=True)
    stats.record("10.0.0.1:8000", "predicted", predicted_ttft_ms=110, observed_ttft_ms=140, slo_met=False)
    stats.record("10.0.0.1:8000", "explore", predicted_ttft_ms=130, observed_ttft_ms=160, slo_met=True)
    stats.record("10.0.0.2:8000", "heuristic", predicted_ttft_ms=None, observed_ttft_ms=None, slo_met=None)
    stats.record("10.0.0.3:8000", "heuristic", predicted_ttft_ms=None, observed_ttft_ms=70, slo_met=None)
    stats.record("10.0.0.3:8000", "heuristic", predicted_ttft_ms=None, observed_ttft_ms=90, slo_met=None)
    stats.record("10.0.0.9:8000", "heuristic", predicted_ttft_ms=None, observed_ttft_ms=50, slo_met=None)

    status = stats.status("gateway", pool, predictor_mode="embedded", predictor=None, queued=None)

    assert status.schema == STATUS_SCHEMA
    assert (status.front_end, status.uptime_s, status.window, status.requests) == ("gateway", 1.5, 2, 7)
    assert status.routes == {"predicted": 2, "explore": 1, "heuristic": 4}
    assert (status.slo.requests, status.slo.met, status.slo.attainment) == (3, 2, pytest.approx(2 / 3))
    assert status.predictor.mode == "off" and not status.predictor.ready  # no backend: off
    # Only the pool's current endpoints; the one that left (10.0.0.9) is not shown.
    first, second, third = status.endpoints
    assert [e.address for e in status.endpoints] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    assert (first.healthy, first.inflight_requests, first.waiting, first.running) == (True, 2, 3, 5)
    assert (first.kv_usage, first.metrics_age_s, first.picks) == (0.25, 1.5, 3)
    # Means over the last two successful requests (the window).
    assert (first.predicted_ttft_ms, first.observed_ttft_ms) == (120.0, 150.0)
    assert (second.picks, second.predicted_ttft_ms, second.observed_ttft_ms) == (1, None, None)  # failed
    assert second.metrics_age_s is None  # never scraped
    # Without predictions, the observed TTFT of all of them.
    assert (third.healthy, third.picks) == (False, 2)
    assert (third.predicted_ttft_ms, third.observed_ttft_ms) == (None, 80)


def test_each_subscribed_endpoint_shows_its_kv_index_trust_and_it_round_trips():
    clock = ManualClock(100.0)
    pool = _pool(clock)
    trust = KVTrustBoard()
    trust.pod("10.0.0.1:8000", 100.0)
    trust.pod("10.0.0.2:8000", 100.0).gap_opened(101.0)
    clock.advance(5.0)
    status = RouterStats(clock).status(
        "gateway", pool, predictor_mode="off", predictor=None, queued=None, kv_trust=trust.views()
    )
    first, second, third = status.endpoints
    assert first.kv_index == KVIndexStatus(state=TrustState.EXACT, reason=TrustReason.NONE, for_s=5.0)
    assert second.kv_index == KVIndexStatus(state=TrustState.DEGRADED, reason=TrustReason.GAP, for_s=4.0)
    assert third.kv_index is None  # not subscribed
    page = json.loads(encode_status(status))
    assert page["endpoints"][1]["kv_index"] == {"state": "degraded", "reason": "gap", "for_s": 4.0}
    assert decode_status(encode_status(status)) == status


def test_predicted_and_observed_ttft_are_of_the_same_requests():
    clock = ManualClock()
    stats = RouterStats(clock)
    pool = PoolState([Endpoint("10.0.0.1:8000")])
    stats.record("10.0.0.1:8000", "fallback", predicted_ttft_ms=None, observed_ttft_ms=900, slo_met=None)
    stats.record("10.0.0.1:8000", "predicted", predicted_ttft_ms=100, observed_ttft_ms=120, slo_met=None)
    nan = float("nan")
    stats.record("10.0.0.1:8000", "predicted", predicted_ttft_ms=nan, observed_ttft_ms=9, slo_met=None)
    (endpoint,) = stats.status("gateway", pool, predictor_mode="off", predictor=None, queued=None).endpoints
    assert (endpoint.picks, endpoint.predicted_ttft_ms, endpoint.observed_ttft_ms) == (3, 100, 120)


def test_the_payload_round_trips_and_anything_else_is_refused():
    clock = ManualClock()
    stats = RouterStats(clock)
    stats.record("10.0.0.1:8000", "predicted", predicted_ttft_ms=90, observed_ttft_ms=100, slo_met=True)
    status = stats.status("picker", _pool(clock), predictor_mode="embedded", predictor=None, queued=4)
    body = encode_status(status)
    assert decode_status(body) == status
    page = json.loads(body)
    assert page["endpoints"][0]["observed_ttft_ms"] == 100.0
    assert page["queued"] == 4 and page["slo"] == {"requests": 1, "met": 1}
    for other in (b"<html>hello</html>", b'{"status": "ok"}', b"# HELP x\n"):
        with pytest.raises(NotAStatusPageError, match="not a slorouter status page"):
            decode_status(other)
    with pytest.raises(NotAStatusPageError, match=r"expected 'slorouter\.router-status/v1'"):
        decode_status(body.replace(STATUS_SCHEMA.encode(), b"slorouter.router-status/v0"))


class _Backend:
    """What the status page reads of a predictor."""

    def __init__(self, report: WarmStartReport | None) -> None:
        self.ready = False
        self.versions = {"ttft": None, "tpot": "v2"}
        self.warm_start_report = report
        self.stale_servers: dict[str, dict[str, str]] = {}


def test_the_page_says_what_the_warm_start_took_over_and_how_its_live_check_went():
    clock = ManualClock()
    report = WarmStartReport(
        models={"ttft": "v1", "tpot": "v2"},
        samples={"ttft": 290, "tpot": 290},
        saved_at=1.7e9,
        refused=[Refusal("model", "ttft", "inaccurate", "ttft model v1 predicted ...")],
        live_checks={
            "ttft": LiveCheck("dropped", 32, samples=32, ratio=4.4, mape=3.5, version="v1"),
            "tpot": LiveCheck("pending", 32),
        },
    )
    pool = _pool(clock)
    status = RouterStats(clock).status(
        "gateway", pool, predictor_mode="embedded", predictor=_Backend(report), queued=None
    )
    assert status.predictor.warm_start == report
    assert decode_status(encode_status(status)) == status
    page = json.loads(encode_status(status))["predictor"]["warm_start"]
    assert page["live_checks"]["ttft"] == {
        "state": "dropped",
        "needed": 32,
        "samples": 32,
        "ratio": 4.4,
        "mape": 3.5,
        "version": "v1",
    }
    assert page["refused"] == [
        {"item": "model", "kind": "ttft", "reason": "inaccurate", "error": "ttft model v1 predicted ..."}
    ]
    # Without a state directory (or a remote predictor): none.
    status = RouterStats(clock).status(
        "gateway", pool, predictor_mode="embedded", predictor=_Backend(None), queued=None
    )
    assert status.predictor.warm_start is None and decode_status(encode_status(status)) == status
