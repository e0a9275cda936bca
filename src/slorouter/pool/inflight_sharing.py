"""The shared in-flight view between the worker processes of one picker pod, over Unix datagram sockets.

Each worker binds ``<directory>/<index>.sock`` and, right after its own in-flight counts change (once per
turn of its event loop) and at least every ``heartbeat_s``, sends its ``InFlightPublication``
(``slorouter.pool.shared_inflight``: absolute counts, an epoch per process life, a sequence number) to every
other worker's socket; what it receives goes to its board, and the others' live totals into the in-flight
columns its plugins read. A worker that stops cleanly publishes empty counts first; one that dies stops
refreshing its slot, which the others drop after ``ttl_s``. A datagram that does not decode, or a peer not
listening yet, costs that one publication (the next one replaces it): the view degrades to each worker's
own counts, never blocks routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from pathlib import Path

import msgspec

from slorouter.clock import Clock
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.shared_inflight import InFlightPublication, SharedInFlightBoard, SharedInFlightView

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.05
TTL_S = 0.5
_MAX_DATAGRAM = 1 << 20


class _Wire(msgspec.Struct, array_like=True):
    picker: str
    epoch: int
    seq: int
    counts: dict[str, tuple[int, int, int, int]]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Wire)


def encode(publication: InFlightPublication) -> bytes:
    return _ENCODER.encode(
        _Wire(publication.picker, publication.epoch, publication.seq, dict(publication.counts))
    )


def decode(data: bytes) -> InFlightPublication:
    """A publication from its datagram; ``ValueError`` naming what is wrong."""
    try:
        wire = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not an in-flight publication: {exc}") from None
    return InFlightPublication(wire.picker, wire.epoch, wire.seq, wire.counts)


class InFlightSharing:
    """Worker ``index`` of ``workers``: publishes its tracker's counts, folds the others' into its pool."""

    def __init__(
        self,
        tracker: InFlightTracker,
        clock: Clock,
        directory: Path,
        index: int,
        workers: int,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        ttl_s: float = TTL_S,
    ) -> None:
        self._tracker = tracker
        self._directory = directory
        self._index = index
        self._peers = [str(directory / f"{i}.sock") for i in range(workers) if i != index]
        self._heartbeat_s = heartbeat_s
        self.board = SharedInFlightBoard(ttl_s, clock)
        # The epoch grows across a worker's lives: its start time.
        self.view = SharedInFlightView(tracker.pool, f"worker-{index}", epoch=time.time_ns())
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._publish_scheduled = False
        self._bad_peers: set[str] = set()
        self.rejected = 0  # datagrams that did not decode

    @property
    def path(self) -> Path:
        return self._directory / f"{self._index}.sock"

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        path = self.path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead life's socket file
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(path))
        sock.setblocking(False)
        self._socket = sock
        self._loop.add_reader(sock.fileno(), self._readable)
        self._tracker.on_change = self._changed
        self._publish()
        self._timer = self._loop.call_later(self._heartbeat_s, self._tick)

    def stop(self) -> None:
        """Publish empty counts (the others drop this worker's load at once), then close."""
        if self._socket is None:
            return
        self._tracker.on_change = None
        last = self.view.publication()  # for its sequence number: the empty one is newer than any before
        self._send(encode(InFlightPublication(last.picker, last.epoch, last.seq, {})))
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._loop.remove_reader(self._socket.fileno())
        self._socket.close()
        self._socket = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.view.detach()

    def _changed(self) -> None:
        if not self._publish_scheduled and self._loop is not None:
            self._publish_scheduled = True
            self._loop.call_soon(self._publish)

    def _publish(self) -> None:
        self._publish_scheduled = False
        if self._socket is not None:
            self._send(encode(self.view.publication()))

    def _send(self, data: bytes) -> None:
        assert self._socket is not None
        for peer in self._peers:
            try:
                self._socket.sendto(data, peer)
            except (FileNotFoundError, ConnectionRefusedError, BlockingIOError):
                pass  # not listening yet (starting, restarting) or its queue is full: the next one counts
            except OSError as exc:
                if peer not in self._bad_peers:
                    self._bad_peers.add(peer)
                    log.warning("in-flight publication to %s failed: %s", peer, exc)

    def _readable(self) -> None:
        assert self._socket is not None
        taken = False
        while True:
            try:
                data = self._socket.recv(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            try:
                publication = decode(data)
            except ValueError as exc:
                self.rejected += 1
                log.warning("in-flight publication dropped: %s", exc)
                continue
            taken = self.board.receive(publication) or taken
        if taken:
            self.view.refresh(self.board)

    def _tick(self) -> None:
        self._publish()
        self.view.refresh(self.board)  # applies expiry even when nothing arrives
        assert self._loop is not None
        self._timer = self._loop.call_later(self._heartbeat_s, self._tick)
