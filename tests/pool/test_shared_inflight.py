"""The shared in-flight view: slots, epochs, sequence numbers, TTL, and folding the others' counts into a
picker's pool without disturbing its own accounting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slorouter.clock import ManualClock
from slorouter.pool.inflight import InFlightHandle, InFlightTracker
from slorouter.pool.shared_inflight import (
    COLUMNS,
    ZERO,
    Counts,
    InFlightPublication,
    SharedInFlightBoard,
    SharedInFlightView,
)
from slorouter.pool.state import Endpoint, PoolState

A, B, C = "a:1", "b:1", "c:1"


def _pool() -> PoolState:
    return PoolState([Endpoint(A), Endpoint(B), Endpoint(C)])


def _columns(pool: PoolState, address: str) -> Counts:
    pos = pool.position(address)
    values = [int(pool.columns[name][pos]) for name in COLUMNS]
    return (values[0], values[1], values[2], values[3])


def test_the_newest_publication_of_each_picker_counts() -> None:
    clock = ManualClock()
    board = SharedInFlightBoard(ttl_s=1.0, clock=clock)
    assert board.receive(InFlightPublication("p1", 1, 1, {A: (2, 100, 0, 0)}))
    assert board.receive(InFlightPublication("p2", 7, 1, {A: (1, 10, 0, 0), B: (1, 0, 50, 1)}))
    assert board.totals() == {A: (3, 110, 0, 0), B: (1, 0, 50, 1)}
    assert board.totals(exclude="p2") == {A: (2, 100, 0, 0)}
    # newer sequence replaces the slot wholesale; an older or repeated one is ignored
    assert board.receive(InFlightPublication("p1", 1, 3, {B: (1, 5, 0, 0)}))
    assert not board.receive(InFlightPublication("p1", 1, 2, {A: (9, 9, 9, 9)}))
    assert not board.receive(InFlightPublication("p1", 1, 3, {A: (9, 9, 9, 9)}))
    assert board.totals(exclude="p2") == {B: (1, 5, 0, 0)}


def test_a_restarted_picker_replaces_its_dead_life_and_stragglers_are_ignored() -> None:
    clock = ManualClock()
    board = SharedInFlightBoard(ttl_s=1.0, clock=clock)
    board.receive(InFlightPublication("p1", 1, 40, {A: (5, 500, 0, 0)}))
    assert board.receive(InFlightPublication("p1", 2, 1, {}))  # new life, seq starts again
    assert board.totals() == {}
    assert not board.receive(InFlightPublication("p1", 1, 41, {A: (5, 500, 0, 0)}))  # late, old life
    assert board.totals() == {}


def test_a_dead_pickers_load_disappears_after_the_ttl() -> None:
    clock = ManualClock()
    board = SharedInFlightBoard(ttl_s=0.5, clock=clock)
    board.receive(InFlightPublication("dead", 1, 1, {A: (3, 0, 30, 3)}))
    board.receive(InFlightPublication("alive", 1, 1, {A: (1, 0, 10, 1)}))
    for seq in range(2, 8):  # "alive" heartbeats every 0.1 s, "dead" is silent
        clock.advance(0.1)
        board.receive(InFlightPublication("alive", 1, seq, {A: (1, 0, 10, 1)}))
    assert board.totals() == {A: (1, 0, 10, 1)}
    assert board.live() == ["alive"]
    # its straggler cannot bring it back while its highest sequence is remembered
    assert not board.receive(InFlightPublication("dead", 1, 1, {A: (3, 0, 30, 3)}))
    clock.advance(10.0)
    assert board.expire() == ["alive"] and board.totals() == {}
    # after forget_after_s (10 × TTL) the picker id is forgotten: a new publication is a new slot
    assert board.receive(InFlightPublication("dead", 1, 1, {A: (1, 0, 0, 0)}))


def test_publications_and_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="integers >= 0"):
        InFlightPublication("p", 1, 1, {A: (1, -1, 0, 0)})
    with pytest.raises(ValueError, match="integers >= 0"):
        InFlightPublication("p", 1, 1, {A: (1, 0, 0)})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="ttl_s"):
        SharedInFlightBoard(ttl_s=0, clock=ManualClock())
    with pytest.raises(ValueError, match="forget_after_s"):
        SharedInFlightBoard(ttl_s=1, clock=ManualClock(), forget_after_s=0.5)


def test_the_view_adds_the_others_and_publishes_only_its_own() -> None:
    clock = ManualClock()
    board = SharedInFlightBoard(ttl_s=1.0, clock=clock)
    pool = _pool()
    tracker = InFlightTracker(pool)
    view = SharedInFlightView(pool, "me", epoch=1)
    mine = tracker.dispatch(A, prompt_tokens=100, max_tokens=10, cached_tokens=40)
    board.receive(InFlightPublication("other", 1, 1, {A: (2, 300, 0, 0), B: (1, 0, 64, 1)}))
    view.refresh(board)
    assert _columns(pool, A) == (3, 360, 0, 0) and _columns(pool, B) == (1, 0, 64, 1)
    assert view.own() == {A: (1, 60, 0, 0)} and view.others() == {A: (2, 300, 0, 0), B: (1, 0, 64, 1)}
    mine.first_token()
    publication = view.publication()
    assert (publication.picker, publication.epoch, publication.seq) == ("me", 1, 1)
    assert publication.counts == {A: (1, 0, 110, 1)}
    assert view.publication().seq == 2
    board.receive(publication)  # its own slot on the board is not added to itself
    view.refresh(board)
    assert _columns(pool, A) == (3, 300, 110, 1)
    mine.finish()
    view.detach()
    assert all(_columns(pool, a) == ZERO for a in (A, B, C))


def test_an_endpoint_that_left_and_came_back_starts_from_zero() -> None:
    clock = ManualClock()
    board = SharedInFlightBoard(ttl_s=1.0, clock=clock)
    pool = _pool()
    view = SharedInFlightView(pool, "me", epoch=1)
    board.receive(InFlightPublication("other", 1, 1, {A: (2, 20, 0, 0), C: (1, 1, 0, 0)}))
    view.refresh(board)
    pool.remove(A)
    pool.add(Endpoint(A))
    assert view.own() == {}  # what was added to the old row is not counted as own
    view.refresh(board)
    assert _columns(pool, A) == (2, 20, 0, 0) and view.own() == {}
    pool.remove(C)
    board.receive(InFlightPublication("other", 1, 2, {}))
    view.refresh(board)
    assert _columns(pool, A) == ZERO and view.others() == {}


# --- properties -------------------------------------------------------------------------------------------

_counts = st.tuples(*(st.integers(0, 1000) for _ in COLUMNS))
_publication = st.builds(
    InFlightPublication,
    picker=st.sampled_from(["p1", "p2", "p3"]),
    epoch=st.integers(1, 3),
    seq=st.integers(1, 6),
    counts=st.dictionaries(st.sampled_from([A, B, C]), _counts, max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_publication, st.floats(0.0, 0.4)), max_size=40))
def test_board_totals_are_the_newest_live_publication_of_each_picker(
    steps: list[tuple[InFlightPublication, float]],
) -> None:
    """Whatever the order, duplicates and gaps of the publications: the totals are the sum, over pickers whose
    newest accepted publication arrived within the TTL, of that publication's counts."""
    ttl = 1.0
    clock = ManualClock()
    board = SharedInFlightBoard(ttl_s=ttl, clock=clock, forget_after_s=1e9)
    newest: dict[str, tuple[tuple[int, int], InFlightPublication, float]] = {}
    for publication, wait in steps:
        clock.advance(wait)
        key = (publication.epoch, publication.seq)
        known = newest.get(publication.picker)
        accepted = known is None or key > known[0]
        assert board.receive(publication) == accepted
        if accepted:
            newest[publication.picker] = (key, publication, clock.now())
        expected: dict[str, list[int]] = {}
        for _, pub, at in newest.values():
            if clock.now() - at <= ttl:
                for address, counts in pub.counts.items():
                    total = expected.setdefault(address, [0, 0, 0, 0])
                    for j, c in enumerate(counts):
                        total[j] += c
        assert board.totals() == {a: tuple(t) for a, t in expected.items() if any(t)}


_op = st.one_of(
    st.tuples(st.just("dispatch"), st.sampled_from([A, B, C]), st.integers(0, 500), st.integers(0, 100)),
    st.tuples(st.just("first_token"), st.integers(0, 50)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("publish"), _counts, _counts),
    st.tuples(st.just("rejoin"), st.sampled_from([A, B, C])),
    st.tuples(st.just("wait"), st.floats(0.0, 0.6)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_op, max_size=60))
def test_the_pool_reads_own_plus_others_and_nothing_leaks(ops: list[tuple[object, ...]]) -> None:
    """Own accounting (dispatch, first token, finish, endpoints leaving and rejoining) interleaved with the
    other picker's publications and the TTL: after every refresh the pool's columns are exactly own + the
    others' live totals, own is what the open handles hold, and once they finish and the view detaches (or
    the other goes silent past the TTL) every column is back to zero."""
    clock = ManualClock()
    board = SharedInFlightBoard(ttl_s=1.0, clock=clock)
    pool = _pool()
    tracker = InFlightTracker(pool)
    view = SharedInFlightView(pool, "me", epoch=1)
    handles: list[tuple[InFlightHandle, int | None]] = []
    seq = 0
    for op in ops:
        kind = op[0]
        if kind == "dispatch":
            _, address, prompt, max_tokens = op
            assert isinstance(address, str) and isinstance(prompt, int) and isinstance(max_tokens, int)
            handles.append(
                (tracker.dispatch(address, prompt, max_tokens, prompt // 3), pool.incarnation(address))
            )
        elif kind in ("first_token", "finish") and handles:
            index = op[1]
            assert isinstance(index, int)
            handle = handles[index % len(handles)][0]
            handle.first_token() if kind == "first_token" else handle.finish()
        elif kind == "publish":
            seq += 1
            a_counts, b_counts = op[1], op[2]
            board.receive(InFlightPublication("other", 1, seq, {A: a_counts, B: b_counts}))  # type: ignore[dict-item]
        elif kind == "rejoin":
            address = op[1]
            assert isinstance(address, str)
            pool.remove(address)
            pool.add(Endpoint(address))
        elif kind == "wait":
            wait = op[1]
            assert isinstance(wait, float)
            clock.advance(wait)
        view.refresh(board)
        others = board.totals(exclude="me")
        own = _own_of(pool, handles)
        assert view.own() == {a: c for a, c in own.items() if c != ZERO}
        for address in (A, B, C):
            expected = tuple(o + t for o, t in zip(own[address], others.get(address, ZERO), strict=True))
            assert _columns(pool, address) == expected
    for handle, _ in handles:
        handle.finish()
    view.detach()
    assert all(_columns(pool, a) == ZERO for a in (A, B, C))
    assert tracker.outstanding() == 0


def _own_of(pool: PoolState, handles: list[tuple[InFlightHandle, int | None]]) -> dict[str, Counts]:
    """What the open handles dispatched to each endpoint's current stay in the pool hold."""
    own = {a: [0, 0, 0, 0] for a in (A, B, C)}
    for handle, incarnation in handles:
        if handle.finished or incarnation != pool.incarnation(handle.address):
            continue
        total = own[handle.address]
        total[0] += 1
        if handle.decoding:
            total[2] += handle.prompt_tokens + handle.max_tokens
            total[3] += 1
        else:
            total[1] += handle.prefill_tokens
    return {a: (t[0], t[1], t[2], t[3]) for a, t in own.items()}
