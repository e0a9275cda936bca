"""The prediction ledger: its figures, its window, and its drift rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from slorouter.clock import ManualClock
from slorouter.predictor.ledger import LedgerCollector, LedgerSettings, PredictionLedger


def ledger(clock: ManualClock, **settings: float) -> PredictionLedger:
    return PredictionLedger(clock, LedgerSettings(**settings), point_factor=lambda kind: 0.5)  # type: ignore[arg-type]


def test_coverage_mape_and_bias_per_endpoint_and_objective():
    clock = ManualClock()
    book = ledger(clock)
    # Predicted p90 200 ms, point 100 ms, on a: outcomes 50, 100, 150, 300 (one above the p90).
    for actual in (50.0, 100.0, 150.0, 300.0):
        book.add("a", "chat", "ttft", 200.0, actual)
    book.add("b", "batch", "tpot", 20.0, 10.0)
    summary = book.summary()
    a = summary.endpoints["a"]["ttft"]
    assert a.outcomes == 4 and a.coverage == 0.75
    assert a.mape == pytest.approx((50 / 50 + 0 + 50 / 150 + 200 / 300) / 4)
    # log(point / actual): log 2, 0, log(2/3), log(1/3); the median is between 0 and log(2/3).
    assert a.bias == pytest.approx(math.expm1((0 + math.log(2 / 3)) / 2))
    assert summary.objectives["chat"]["ttft"].outcomes == 4
    assert summary.objectives["batch"]["tpot"] == summary.endpoints["b"]["tpot"]
    assert summary.endpoints["b"]["tpot"].bias == pytest.approx(0.0)


def test_without_point_predictions_only_coverage_is_known():
    clock = ManualClock()
    book = PredictionLedger(clock, point_factor=lambda kind: math.nan)
    book.add("a", "none", "ttft", 100.0, 50.0)
    accuracy = book.summary().endpoints["a"]["ttft"]
    assert (accuracy.coverage, accuracy.mape, accuracy.bias) == (1.0, None, None)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=2, max_size=2))
def test_outcomes_that_are_not_positive_finite_numbers_are_left_out(pair):
    book = ledger(ManualClock())
    predicted, actual = pair
    book.add("a", "none", "ttft", predicted, actual)
    valid = predicted > 0 and actual > 0 and math.isfinite(predicted * actual)
    assert len(book) == (1 if valid else 0)


def test_the_window_is_bounded_in_time_and_size():
    clock = ManualClock()
    book = ledger(clock, window_s=10.0, max_entries=3)
    for i in range(5):
        book.add("a", "none", "ttft", 100.0, 10.0 + i)
    assert len(book) == 3
    clock.advance(10.5)
    book.add("a", "none", "ttft", 100.0, 1.0)
    assert book.summary().endpoints["a"]["ttft"].outcomes == 1


def drift_ledger(clock: ManualClock, asked: list[tuple[str, str]], **kw: float) -> PredictionLedger:
    defaults = {"min_outcomes": 10, "drift_after_s": 30.0, "check_interval_s": 5.0, "window_s": 60.0}
    settings = LedgerSettings(**{**defaults, **kw})  # type: ignore[arg-type]
    return PredictionLedger(clock, settings, on_drift=lambda e, k: asked.append((e, k)))


def feed(
    book: PredictionLedger,
    clock: ManualClock,
    seconds: float,
    actual: float,
    endpoint: str = "a",
    served: float | None = None,
) -> None:
    """One outcome per second against a 100 ms predicted quantile (served as ``served``: the same by
    default)."""
    for _ in range(int(seconds)):
        clock.advance(1.0)
        book.add(endpoint, "none", "ttft", 100.0, actual, served)


def test_an_endpoint_out_of_band_for_drift_after_s_drifts_once_and_recovers(caplog):
    clock = ManualClock()
    asked: list[tuple[str, str]] = []
    book = drift_ledger(clock, asked, coverage_low=0.6, coverage_high=0.99)
    feed(book, clock, 60, 50.0)  # covered: 1.0 > 0.99, out of band from the first check with 10 outcomes
    assert asked == [("a", "ttft")] and book.drifts == 1
    assert book.summary().drifting == {"a": ["ttft"]}
    assert "prediction drift: a's TTFT predictions covered 1.00" in caplog.text
    feed(book, clock, 30, 50.0)
    assert book.drifts == 1  # still the same drift: asked once
    feed(book, clock, 120, 200.0)  # now never covered: on its way from 1.0 to 0.0 it passed the band
    assert book.drifts == 2 and asked == [("a", "ttft")] * 2 and book.summary().drifting == {"a": ["ttft"]}
    for i in range(120):  # 9 in 10 covered: back in band, as the window fills with them
        clock.advance(1.0)
        book.add("a", "none", "ttft", 100.0, 50.0 if i % 10 else 200.0)
    assert book.summary().drifting == {}


def test_a_short_excursion_is_not_a_drift():
    clock = ManualClock()
    asked: list[tuple[str, str]] = []
    book = drift_ledger(clock, asked, coverage_high=1.0, window_s=10.0)
    feed(book, clock, 20, 90.0)  # covered: in band
    feed(book, clock, 20, 200.0)  # out of band for less than 30 s
    feed(book, clock, 20, 90.0)
    assert asked == [] and book.drifts == 0


def test_too_few_outcomes_are_not_judged_and_a_drift_waits_for_outcomes_to_end():
    clock = ManualClock()
    asked: list[tuple[str, str]] = []
    book = drift_ledger(clock, asked, coverage_high=1.0)
    for _ in range(100):  # one outcome every 10 s: at most 6 in the window, below min_outcomes
        clock.advance(10.0)
        book.add("a", "none", "ttft", 100.0, 500.0)
    assert asked == []
    feed(book, clock, 60, 500.0)
    assert book.summary().drifting == {"a": ["ttft"]}
    clock.advance(120.0)  # the pod got no traffic: nothing says the drift is over
    book.add("b", "none", "ttft", 100.0, 50.0)
    assert book.summary().drifting == {"a": ["ttft"]}


def test_the_drift_of_an_endpoint_that_left_the_pool_is_forgotten():
    clock = ManualClock()
    members = ["a", "b"]
    settings = LedgerSettings(min_outcomes=10, drift_after_s=30.0, coverage_high=1.0)
    book = PredictionLedger(clock, settings, members=lambda: members)
    feed(book, clock, 60, 500.0)
    assert book.summary().drifting == {"a": ["ttft"]}
    members.remove("a")
    feed(book, clock, 10, 50.0, endpoint="b")
    assert book.summary().drifting == {}


def test_a_failing_retrain_request_does_not_stop_the_ledger(caplog):
    clock = ManualClock()

    def fail(endpoint: str, kind: str) -> None:
        raise RuntimeError("trainer gone")

    settings = LedgerSettings(min_outcomes=10, drift_after_s=30.0, coverage_high=1.0)
    book = PredictionLedger(clock, settings, on_drift=fail)
    feed(book, clock, 60, 500.0)
    assert book.drifts == 1 and "asking for a retrain after a drift failed" in caplog.text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"quantile": 1.0}, "quantile"),
        ({"coverage_low": 0.9, "coverage_high": 0.8}, "coverage band"),
        ({"window_s": 0.0}, "window_s"),
        ({"min_outcomes": 0}, "min_outcomes"),
    ],
)
def test_bad_settings_name_the_problem(settings, message):
    with pytest.raises(ValueError, match=message):
        LedgerSettings(**settings)


def test_the_collector_exports_the_figures_and_the_drifts():
    clock = ManualClock()
    settings = LedgerSettings(min_outcomes=10, drift_after_s=30.0, coverage_high=1.0)
    book = PredictionLedger(clock, settings, point_factor=lambda kind: 0.5)
    feed(book, clock, 60, 500.0)
    registry = CollectorRegistry()
    registry.register(LedgerCollector(book))
    text = generate_latest(registry).decode()
    assert 'slorouter_prediction_ledger_coverage{endpoint="a",kind="ttft"} 0.0' in text
    assert 'slorouter_prediction_ledger_objective_outcomes{kind="ttft",objective="none"} 60.0' in text
    assert 'slorouter_prediction_ledger_bias{endpoint="a",kind="ttft"} -0.9' in text
    assert 'slorouter_prediction_drifting{endpoint="a",kind="ttft"} 1.0' in text
    assert "slorouter_prediction_drifts_total 1.0" in text


def test_a_drift_that_outlasts_fallback_after_s_distrusts_the_endpoint_until_back_in_band(caplog):
    clock = ManualClock()
    settings = LedgerSettings(min_outcomes=10, drift_after_s=30.0, fallback_after_s=60.0, coverage_high=1.0)
    book = PredictionLedger(clock, settings)
    feed(book, clock, 60, 500.0)  # drifting from about 40 s
    assert book.summary().drifting and not book.distrusts(["a", "b"])
    feed(book, clock, 60, 500.0)
    assert book.distrusts(["a", "b"]) and not book.distrusts(["b"])
    assert book.summary().distrusted == ["a"]
    assert "requests with it among their candidates are routed by the heuristic profile" in caplog.text
    feed(book, clock, 90, 50.0)  # the retrained model covers again
    assert not book.distrusts(["a"]) and book.summary().distrusted == []
    registry = CollectorRegistry()
    registry.register(LedgerCollector(book))
    assert "slorouter_prediction_distrusted{" not in generate_latest(registry).decode()


def test_a_drift_the_live_coverage_factor_makes_up_for_is_reported_but_keeps_routing_by_prediction():
    clock = ManualClock()
    settings = LedgerSettings(min_outcomes=10, drift_after_s=30.0, fallback_after_s=60.0, coverage_high=1.0)
    book = PredictionLedger(clock, settings)
    feed(book, clock, 180, 500.0, served=600.0)  # the quantile misses, the served figure covers
    assert book.summary().drifting == {"a": ["ttft"]} and not book.distrusts(["a"])
    feed(book, clock, 60, 500.0, served=400.0)  # the factor no longer makes up for it
    assert book.distrusts(["a"])


def test_without_fallback_after_s_a_drift_never_changes_routing():
    clock = ManualClock()
    settings = LedgerSettings(min_outcomes=10, drift_after_s=30.0, fallback_after_s=None, coverage_high=1.0)
    book = PredictionLedger(clock, settings)
    feed(book, clock, 600, 500.0)
    assert book.summary().drifting and not book.distrusts(["a"])
