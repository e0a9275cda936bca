"""The scrapes' view of the KV-event trust: silent pods that serve, restarts the sequence does not show."""

from __future__ import annotations

import pytest

from slorouter.clock import ManualClock
from slorouter.kvevents.wire import BlockStored, KVEventBatch
from slorouter.pool.dialects import VLLM
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_trust import TrustReason, TrustState, TrustThresholds
from slorouter.pool.kv_trust_monitor import KVTrustMonitor
from slorouter.pool.metrics_parser import parse_metrics
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState

A = "10.0.0.1:8000"
T = TrustThresholds(lag_s=2.0, silent_after_s=5.0, rebuild_events=100, rebuild_s=30.0)


class Rig:
    def __init__(self) -> None:
        self.clock = ManualClock(1000.0)
        self.pool = PoolState([Endpoint(A)])
        self.index = KVBlockIndex(trust=T, clock=self.clock)
        self.trust = self.index.pod_trust(A)
        self.monitor = KVTrustMonitor(self.pool, self.index, self.clock)

    def scrape(self, *, running: int = 0, start: float | None = 50.0, queries: float | None = None) -> None:
        snapshot = MetricsSnapshot(running=running, process_start_s=start, prefix_cache_queries=queries)
        self.pool.set_metrics(A, snapshot, at=self.clock.now())
        self.monitor.check()

    def event(self) -> None:
        self.index.apply(A, KVEventBatch(0.0, [BlockStored([1], None, [], 16)]))
        self.trust.batch(self.clock.now(), lag_s=0.0, events=1)

    def state(self) -> tuple[TrustState, TrustReason]:
        return self.trust.state, self.trust.reason


def test_events_that_stop_while_the_pod_runs_requests_make_it_silent() -> None:
    rig = Rig()
    rig.event()
    rig.scrape(running=3)
    rig.clock.advance(4.0)
    rig.scrape(running=3)
    assert rig.state() == (TrustState.EXACT, TrustReason.NONE)
    rig.clock.advance(1.5)
    rig.scrape(running=3)
    assert rig.state() == (TrustState.DEGRADED, TrustReason.SILENT)
    assert not rig.index.trusted(A)
    rig.event()
    assert rig.state() == (TrustState.EXACT, TrustReason.NONE)


def test_a_moving_prefix_cache_query_counter_shows_a_pod_serving_between_scrapes() -> None:
    rig = Rig()
    rig.event()
    rig.scrape(queries=100)
    rig.clock.advance(6.0)
    rig.scrape(queries=100)  # idle: no event expected
    assert rig.trust.state is TrustState.EXACT
    rig.clock.advance(0.5)
    rig.scrape(queries=180)  # it served a request, and published nothing
    assert rig.state() == (TrustState.DEGRADED, TrustReason.SILENT)


def test_an_idle_pod_is_never_silent() -> None:
    rig = Rig()
    rig.event()
    for _ in range(10):
        rig.clock.advance(5.0)
        rig.scrape(running=0, queries=7)
    assert rig.trust.state is TrustState.EXACT


def test_a_new_process_start_time_clears_the_pod_though_its_sequence_never_went_back() -> None:
    rig = Rig()
    rig.event()
    rig.scrape(start=50.0)
    assert rig.index.num_blocks(A) == 1
    rig.clock.advance(1.0)
    rig.scrape(start=1001.0)
    assert rig.state() == (TrustState.REBUILDING, TrustReason.PROCESS_RESTART)
    assert rig.index.num_blocks(A) == 0


def test_a_counter_that_goes_back_is_a_restart_too() -> None:
    rig = Rig()
    rig.scrape(start=None, queries=500)
    rig.clock.advance(1.0)
    rig.scrape(start=None, queries=20)
    assert rig.state() == (TrustState.REBUILDING, TrustReason.PROCESS_RESTART)


def test_the_same_scrape_is_looked_at_once() -> None:
    rig = Rig()
    rig.scrape(start=50.0)
    rig.clock.advance(1.0)
    rig.scrape(start=60.0)
    since = rig.trust.since
    rig.clock.advance(1.0)
    rig.monitor.check()  # no new scrape: no second restart
    assert rig.trust.since == since
    assert rig.trust.transitions[(TrustState.REBUILDING, TrustReason.PROCESS_RESTART)] == 1


def test_a_rebuild_ends_on_the_monitors_tick() -> None:
    rig = Rig()
    rig.index.clear_pod(A, TrustReason.UNRECOVERED_GAP)
    rig.clock.advance(30.0)
    rig.monitor.check()
    assert rig.trust.state is TrustState.EXACT


def test_pods_that_left_are_forgotten() -> None:
    rig = Rig()
    rig.scrape(start=50.0)
    rig.index.remove_pod(A)
    rig.monitor.check()
    rig.index.pod_trust(A)  # the same address, a new pod
    rig.clock.advance(1.0)
    rig.scrape(start=70.0)  # its first scrape: nothing to compare with
    assert rig.index.trust_of(A) is not None
    assert rig.index.trust_of(A).state is TrustState.EXACT  # type: ignore[union-attr]


def test_interval_must_be_positive() -> None:
    rig = Rig()
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        KVTrustMonitor(rig.pool, rig.index, rig.clock, interval_s=0)


PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:kv_cache_usage_perc{model_name="m"} 0.5
vllm:prefix_cache_queries_total{model_name="m",engine="0"} 100.0
vllm:prefix_cache_queries_total{model_name="m",engine="1"} 20.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e+09
"""


def test_the_scrape_reads_the_process_start_and_sums_the_query_counters() -> None:
    snapshot = parse_metrics(PAGE, VLLM)
    assert snapshot.process_start_s == 1.7e9
    assert snapshot.prefix_cache_queries == 120.0


def test_a_page_without_them_or_with_a_malformed_one_still_parses() -> None:
    without = parse_metrics(PAGE.split("vllm:prefix_cache_queries_total")[0], VLLM)
    assert without.process_start_s is None and without.prefix_cache_queries is None
    broken = parse_metrics(
        PAGE.replace("process_start_time_seconds 1.7e+09", "process_start_time_seconds x"), VLLM
    )
    assert broken.process_start_s is None and broken.running == 2
