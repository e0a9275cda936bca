"""The per-pod trust state machine of the KV-event index: every rule, on a hand-moved clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from slorouter.pool.config import PoolConfig
from slorouter.pool.kv_trust import (
    CLEAR_REASONS,
    DEGRADED_REASONS,
    KVTrustBoard,
    PodTrust,
    TrustReason,
    TrustState,
    TrustThresholds,
)

T = TrustThresholds(lag_s=2.0, silent_after_s=5.0, rebuild_events=10, rebuild_s=30.0)
R = TrustReason
S = TrustState


def pod(now: float = 0.0) -> PodTrust:
    return PodTrust(T, created=now)


def state(trust: PodTrust) -> tuple[TrustState, TrustReason]:
    return trust.state, trust.reason


def test_a_new_pod_is_exact_since_it_was_first_seen() -> None:
    trust = pod(7.0)
    assert state(trust) == (S.EXACT, R.NONE) and trust.since == 7.0
    assert trust.view().exact


def test_a_gap_degrades_until_it_is_replayed() -> None:
    trust = pod()
    trust.gap_opened(1.0)
    assert state(trust) == (S.DEGRADED, R.GAP) and trust.since == 1.0
    trust.gap_closed(1.2)
    assert state(trust) == (S.EXACT, R.NONE) and trust.since == 1.2


def test_a_gap_that_cannot_be_replayed_ends_in_a_clear_and_a_rebuild() -> None:
    trust = pod()
    trust.gap_opened(1.0)
    trust.cleared(1.5, R.UNRECOVERED_GAP)
    assert state(trust) == (S.REBUILDING, R.UNRECOVERED_GAP) and trust.since == 1.5


def test_a_failed_session_degrades_until_the_next_one_is_in_step() -> None:
    trust = pod()
    trust.session_failed(2.0)
    assert state(trust) == (S.DEGRADED, R.SESSION)
    trust.batch(2.5, lag_s=0.0, events=1)  # a batch alone does not show the new session in step
    assert state(trust) == (S.DEGRADED, R.SESSION)
    trust.in_step(2.6)
    assert state(trust) == (S.EXACT, R.NONE)


def test_events_late_by_more_than_the_threshold_degrade_until_a_timely_batch() -> None:
    trust = pod()
    trust.batch(1.0, lag_s=1.9, events=1)
    assert state(trust) == (S.EXACT, R.NONE)
    trust.batch(2.0, lag_s=2.5, events=1)
    assert state(trust) == (S.DEGRADED, R.LAG) and trust.since == 2.0
    trust.batch(3.0, lag_s=3.0, events=1)  # still late: no new transition
    assert trust.since == 2.0 and trust.transitions[(S.DEGRADED, R.LAG)] == 1
    trust.batch(4.0, lag_s=0.1, events=1)
    assert state(trust) == (S.EXACT, R.NONE)


def test_a_pod_serving_with_no_event_for_silent_after_s_is_silent_until_the_next_batch() -> None:
    trust = pod()
    trust.batch(10.0, lag_s=0.0, events=1)
    trust.serving(14.9, busy=True)
    assert state(trust) == (S.EXACT, R.NONE)
    trust.serving(15.1, busy=False)  # idle: silence is expected
    assert state(trust) == (S.EXACT, R.NONE)
    trust.serving(15.2, busy=True)
    assert state(trust) == (S.DEGRADED, R.SILENT) and trust.since == 15.2
    trust.batch(16.0, lag_s=0.0, events=1)
    assert state(trust) == (S.EXACT, R.NONE)


def test_a_pod_that_never_published_but_serves_turns_silent_from_its_first_sight() -> None:
    trust = pod(100.0)
    trust.serving(104.0, busy=True)
    assert trust.state is S.EXACT
    trust.serving(105.5, busy=True)
    assert state(trust) == (S.DEGRADED, R.SILENT)


def test_the_oldest_degraded_cause_is_the_reason_and_the_state_holds_until_all_end() -> None:
    trust = pod()
    trust.batch(1.0, lag_s=5.0, events=1)
    trust.gap_opened(1.1)
    assert state(trust) == (S.DEGRADED, R.LAG)
    trust.batch(1.2, lag_s=0.0, events=1)  # lag over, gap still open
    assert state(trust) == (S.DEGRADED, R.GAP)
    trust.gap_closed(1.3)
    assert state(trust) == (S.EXACT, R.NONE)


@pytest.mark.parametrize("reason", sorted(CLEAR_REASONS, key=lambda r: r.value))
def test_every_clear_rebuilds_until_enough_events(reason: TrustReason) -> None:
    trust = pod()
    trust.cleared(1.0, reason)
    assert state(trust) == (S.REBUILDING, reason)
    trust.batch(2.0, lag_s=0.0, events=9)
    assert trust.state is S.REBUILDING
    trust.batch(3.0, lag_s=0.0, events=1)
    assert state(trust) == (S.EXACT, R.NONE) and trust.since == 3.0


def test_a_rebuild_also_ends_after_rebuild_s_on_a_tick() -> None:
    trust = pod()
    trust.cleared(1.0, R.SEQUENCE_RESTART)
    trust.tick(30.9)
    assert trust.state is S.REBUILDING
    trust.tick(31.0)
    assert state(trust) == (S.EXACT, R.NONE)


def test_a_clear_while_rebuilding_starts_the_rebuild_over() -> None:
    trust = pod()
    trust.cleared(1.0, R.DECODE_ERROR)
    trust.batch(2.0, lag_s=0.0, events=9)
    trust.cleared(3.0, R.DECODE_ERROR)
    assert trust.since == 3.0 and trust.transitions[(S.REBUILDING, R.DECODE_ERROR)] == 2
    trust.batch(4.0, lag_s=0.0, events=9)  # 9 since the second clear: not yet
    assert trust.state is S.REBUILDING
    trust.tick(32.9)
    assert trust.state is S.REBUILDING
    trust.tick(33.0)
    assert trust.state is S.EXACT


def test_degraded_wins_over_rebuilding_and_the_rebuild_goes_on_meanwhile() -> None:
    trust = pod()
    trust.cleared(1.0, R.OVERFLOW)
    trust.session_failed(2.0)
    assert state(trust) == (S.DEGRADED, R.SESSION)
    trust.batch(3.0, lag_s=0.0, events=10)  # enough events, but the session is not in step yet
    trust.in_step(3.1)
    assert state(trust) == (S.EXACT, R.NONE)


def test_a_clear_ends_a_pending_gap_but_not_other_causes() -> None:
    trust = pod()
    trust.gap_opened(1.0)
    trust.batch(1.1, lag_s=9.0, events=1)
    trust.cleared(1.2, R.SEQUENCE_RESTART)
    assert state(trust) == (S.DEGRADED, R.LAG)
    trust.batch(1.3, lag_s=0.0, events=1)
    assert state(trust) == (S.REBUILDING, R.SEQUENCE_RESTART)


def test_only_clear_reasons_clear() -> None:
    with pytest.raises(ValueError, match="'gap' does not clear"):
        pod().cleared(1.0, R.GAP)
    assert DEGRADED_REASONS.isdisjoint(CLEAR_REASONS)
    assert DEGRADED_REASONS | CLEAR_REASONS | {R.NONE} == set(R)


def test_transitions_are_counted_by_state_and_reason() -> None:
    trust = pod()
    trust.gap_opened(1.0)
    trust.gap_closed(2.0)
    trust.gap_opened(3.0)
    trust.gap_closed(4.0)
    assert trust.transitions == {(S.DEGRADED, R.GAP): 2, (S.EXACT, R.NONE): 2}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lag_s", 0.0, "lag_s must be a finite number > 0"),
        ("silent_after_s", math.nan, "silent_after_s must be a finite number > 0"),
        ("rebuild_s", math.inf, "rebuild_s must be a finite number > 0"),
        ("rebuild_events", 0, "rebuild_events must be >= 1"),
    ],
)
def test_bad_thresholds_name_the_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrustThresholds(**{field: value})  # type: ignore[arg-type]


def test_the_board_creates_on_first_use_and_forgets_a_removed_pod() -> None:
    board = KVTrustBoard(T)
    assert board.exact("a") and board.get("a") is None
    board.pod("a", 0.0).gap_opened(1.0)
    assert not board.exact("a") and board.addresses == {"a"}
    board.pod("b", 0.0).cleared(1.0, R.IDENTITY)
    board.tick(40.0)
    assert board.exact("b")
    board.remove("a")
    assert board.exact("a") and board.addresses == {"b"}


_EVENTS = st.one_of(
    st.tuples(st.just("gap_opened")),
    st.tuples(st.just("gap_closed")),
    st.tuples(st.just("session_failed")),
    st.tuples(st.just("in_step")),
    st.tuples(st.just("batch"), st.floats(0, 10), st.integers(0, 20)),
    st.tuples(st.just("serving"), st.booleans()),
    st.tuples(st.just("cleared"), st.sampled_from(sorted(CLEAR_REASONS, key=lambda r: r.value))),
    st.tuples(st.just("tick")),
)


@given(st.lists(st.tuples(st.floats(0, 20), _EVENTS), max_size=40))
def test_any_history_keeps_the_state_and_reason_consistent(history: list[tuple[float, tuple]]) -> None:  # type: ignore[type-arg]
    trust = pod()
    now = 0.0
    for step, (name, *args) in history:
        now += step
        if name == "batch":
            trust.batch(now, lag_s=args[0], events=args[1])
        elif name == "serving":
            trust.serving(now, busy=args[0])
        elif name == "cleared":
            trust.cleared(now, args[0])
        else:
            getattr(trust, name)(now)
        assert trust.since <= now
        if trust.state is S.EXACT:
            assert trust.reason is R.NONE
        elif trust.state is S.DEGRADED:
            assert trust.reason in DEGRADED_REASONS
        else:
            assert trust.reason in CLEAR_REASONS
    # Whatever happened, a timely batch ends every degraded cause but a gap and a session, and time a rebuild.
    trust.gap_closed(now)
    trust.in_step(now)
    trust.batch(now, lag_s=0.0, events=0)
    trust.tick(now + T.rebuild_s + 1)
    assert state(trust) == (S.EXACT, R.NONE)


def test_the_pool_config_keys_become_the_thresholds_and_bad_ones_are_named() -> None:
    config = PoolConfig.model_validate(
        {
            "endpoints": ["10.0.0.1:8000"],
            "kv_events_lag_threshold_ms": 500,
            "kv_events_silent_after_ms": 8000,
            "kv_events_rebuild_events": 50,
            "kv_events_rebuild_ms": 60_000,
        }
    )
    assert config.kv_trust_thresholds() == TrustThresholds(
        lag_s=0.5, silent_after_s=8.0, rebuild_events=50, rebuild_s=60.0
    )
    assert PoolConfig.model_validate({"endpoints": ["a:1"]}).kv_trust_thresholds() == TrustThresholds()
    for key, value in (
        ("kv_events_lag_threshold_ms", 0),
        ("kv_events_silent_after_ms", float("inf")),
        ("kv_events_rebuild_events", 0),
        ("kv_events_rebuild_ms", -1),
    ):
        with pytest.raises(ValidationError, match=key):
            PoolConfig.model_validate({"endpoints": ["a:1"], key: value})
