"""The workers' shared in-flight view over real Unix datagram sockets, in one process: what one worker
dispatches shows in the other's columns, a clean stop and a death both take it away, and bad datagrams
are dropped without harm."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from slorouter.clock import MonotonicClock
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.inflight_sharing import InFlightSharing, decode, encode
from slorouter.pool.shared_inflight import InFlightPublication
from slorouter.pool.state import Endpoint, PoolState

ADDRESSES = ["10.0.0.1:8000", "10.0.0.2:8000"]


def _worker(directory: Path, index: int, ttl_s: float = 0.5) -> tuple[InFlightTracker, InFlightSharing]:
    tracker = InFlightTracker(PoolState([Endpoint(a) for a in ADDRESSES]))
    return tracker, InFlightSharing(
        tracker, MonotonicClock(), directory, index, 2, heartbeat_s=0.02, ttl_s=ttl_s
    )


def _requests(tracker: InFlightTracker) -> list[int]:
    return [int(v) for v in tracker.pool.columns["inflight_requests"]]


async def _until(predicate, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_a_dispatch_shows_in_the_other_worker_and_a_clean_stop_takes_it_away(tmp_path: Path):
    (a, sharing_a), (b, sharing_b) = _worker(tmp_path, 0), _worker(tmp_path, 1)
    sharing_a.start()
    sharing_b.start()
    try:
        handle = a.dispatch(ADDRESSES[1], prompt_tokens=100, max_tokens=50)
        await _until(lambda: _requests(b) == [0, 1])
        assert b.pool.columns["inflight_prefill_tokens"][1] == 100
        assert _requests(a) == [0, 1]  # its own count, not doubled by what the other sends back
        handle.first_token()
        await _until(lambda: b.pool.columns["inflight_decode_tokens"][1] == 150)
        b_handle = b.dispatch(ADDRESSES[0], 10, 10)
        await _until(lambda: _requests(a) == [1, 1] and _requests(b) == [1, 1])
        handle.finish()
        await _until(lambda: _requests(b) == [1, 0])
        handle = a.dispatch(ADDRESSES[0], 10, 10)
        await _until(lambda: _requests(b) == [2, 0])
        sharing_a.stop()  # still holding a request: the others drop its counts at once
        await _until(lambda: _requests(b) == [1, 0])
        handle.finish()
        b_handle.finish()
    finally:
        sharing_a.stop()
        sharing_b.stop()
    assert _requests(b) == [0, 0] and not list(tmp_path.iterdir())


async def test_a_dead_worker_s_load_is_dropped_after_the_ttl(tmp_path: Path):
    (a, sharing_a), (b, sharing_b) = _worker(tmp_path, 0), _worker(tmp_path, 1, ttl_s=0.2)
    sharing_a.start()
    sharing_b.start()
    try:
        held = a.dispatch(ADDRESSES[0], 10, 10)
        await _until(lambda: _requests(b) == [1, 0])
        # Worker 0 dies: its socket closes without a last publication.
        loop = asyncio.get_running_loop()
        assert sharing_a._socket is not None and sharing_a._timer is not None
        sharing_a._timer.cancel()
        loop.remove_reader(sharing_a._socket.fileno())
        sharing_a._socket.close()
        sharing_a._socket = None
        a.on_change = None
        await asyncio.sleep(0.1)
        assert _requests(b) == [1, 0]  # within the TTL, the last publication stands
        await _until(lambda: _requests(b) == [0, 0], timeout_s=2.0)
        assert _requests(a) == [1, 0]  # the dead worker's own count, for the record
        held.finish()
    finally:
        sharing_b.stop()


async def test_bad_datagrams_are_dropped_and_counted(tmp_path: Path):
    (b, sharing_b) = _worker(tmp_path, 1)
    sharing_b.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            for datagram in (b"garbage", encode(InFlightPublication("x", 1, 1, {}))[:-1]):
                sender.sendto(datagram, str(sharing_b.path))
            negative = encode(InFlightPublication("worker-0", 1, 1, {ADDRESSES[0]: (1, 1, 1, 1)}))
            sender.sendto(negative.replace(b"\x01", b"\xff", 1), str(sharing_b.path))
            sender.sendto(
                encode(InFlightPublication("worker-0", 1, 2, {ADDRESSES[0]: (2, 0, 0, 0)})),
                str(sharing_b.path),
            )
        await _until(lambda: _requests(b) == [2, 0])
        assert sharing_b.rejected >= 2
    finally:
        sharing_b.stop()


def test_publications_round_trip_and_bad_ones_name_the_problem():
    publication = InFlightPublication("worker-3", 17, 5, {ADDRESSES[0]: (1, 2, 3, 4)})
    assert decode(encode(publication)) == publication
    with pytest.raises(ValueError, match="not an in-flight publication"):
        decode(b"\x93\x01")
