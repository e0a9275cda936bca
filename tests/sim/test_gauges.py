"""Late and coarse /metrics gauges (slorouter.sim.gauges), in the reporter and on the /metrics page."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from slorouter.sim.engine import Engine
from slorouter.sim.gauges import GaugeReporter, Gauges
from slorouter.sim.metrics import PodMetrics
from slorouter.sim.profiles import LLAMA3_8B_H100
from slorouter.sim.variants import parse_variant


def fake_engine(**profile_changes: float) -> SimpleNamespace:
    """An object with the gauges the reporter reads, settable by the test."""
    return SimpleNamespace(
        profile=replace(LLAMA3_8B_H100, **profile_changes), num_waiting=0, num_running=0, kv_usage=0.0
    )


def test_live_reporter_reads_the_engine():
    engine = fake_engine()
    reporter = GaugeReporter(engine)  # type: ignore[arg-type]
    engine.num_waiting, engine.num_running, engine.kv_usage = 3, 7, 0.4321
    assert reporter.live and reporter.read(0.0) == Gauges(3, 7, 0.4321)


@pytest.mark.parametrize(
    ("usage", "shown"),
    [(0.0, 0.0), (0.04, 0.0), (0.05, 0.1), (0.449, 0.4), (0.77, 0.8), (0.96, 1.0), (1.0, 1.0)],
)
def test_coarse_kv_usage_rounds_to_the_step(usage, shown):
    engine = fake_engine(kv_usage_step=0.1)
    engine.kv_usage = usage
    assert GaugeReporter(engine).read(0.0).kv_usage == pytest.approx(shown)  # type: ignore[arg-type]


def test_coarse_period_updates_the_gauges_once_per_period():
    engine = fake_engine(metrics_period_ms=1000)
    reporter = GaugeReporter(engine)  # type: ignore[arg-type]
    engine.num_waiting = 1
    assert reporter.read(0.2).waiting == 1  # first read of period [0, 1)
    engine.num_waiting = 5
    assert reporter.read(0.5).waiting == 1
    assert reporter.read(0.999).waiting == 1
    assert reporter.read(1.0).waiting == 5  # period [1, 2)
    engine.num_waiting = 9
    assert reporter.read(1.7).waiting == 5
    assert reporter.read(2.3).waiting == 9


def test_late_gauges_lag_by_the_configured_delay():
    engine = fake_engine(metrics_delay_ms=500)
    reporter = GaugeReporter(engine)  # type: ignore[arg-type]
    for tick in range(40):  # the engine changes every 50 ms; the reporter is shown each state
        now = tick * 0.05
        engine.num_running = tick
        reporter.sample(now)
        shown = reporter.read(now).running
        assert shown == max(tick - 10, 0)  # 500 ms = 10 ticks ago (before any state: idle)
    assert len(reporter._history) <= 12  # only the window is kept


def test_late_and_coarse_compose():
    engine = fake_engine(metrics_delay_ms=200, metrics_period_ms=1000, kv_usage_step=0.25)
    reporter = GaugeReporter(engine)  # type: ignore[arg-type]
    engine.kv_usage = 0.6
    reporter.sample(0.0)
    engine.kv_usage = 0.9
    reporter.sample(0.1)
    assert reporter.read(0.25).kv_usage == 0.5  # state at 0.05: 0.6, rounded to 0.5
    assert reporter.read(0.9).kv_usage == 0.5  # same period
    assert reporter.read(1.0).kv_usage == 1.0  # state at 0.8: 0.9, rounded to 1.0


def test_metrics_page_shows_the_coarse_kv_usage():
    engine = Engine(parse_variant("kv-usage-step=0.5").apply(LLAMA3_8B_H100), jitter_sigma=0.0)
    engine.add_request("a", list(range(8000)), 10, 0.0)
    step = engine.plan_step(0.01)
    assert step is not None and 0 < engine.kv_usage < 0.25
    page = PodMetrics(engine, "m").render(0.02)
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n' in page
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n' in page
