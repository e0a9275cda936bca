"""The shared in-flight view between pickers: the worker processes of one picker pod, over Unix datagram
sockets, and picker replicas (other pods), over UDP.

Each worker binds ``<directory>/<index>.sock`` and, right after its own in-flight counts change (once per
turn of its event loop) and at least every ``heartbeat_s``, sends its ``InFlightPublication``
(``slorouter.pool.shared_inflight``: absolute counts, an epoch per process life, a sequence number) to every
other worker's socket; what it receives goes to its board, and the others' live totals into the in-flight
columns its plugins read. With replicas (``ReplicaPeers``), worker ``i`` also binds UDP ``port + i`` and
sends the same publication to every worker port of every replica host, whose names are resolved again every
few seconds (a headless Service lists the replicas' pods): a publication that reaches a picker twice (its
own pod's workers by both ways) is taken once, by its sequence number. A worker that stops cleanly
publishes empty counts first; one that dies stops refreshing its slot, which the others drop after
``ttl_s``. A datagram that does not decode, or a peer not listening yet, costs that one publication (the next
one replaces it): the view degrades to each picker's own counts, never blocks routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from slorouter.clock import Clock
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.shared_inflight import InFlightPublication, SharedInFlightBoard, SharedInFlightView

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.05
TTL_S = 0.5
RESOLVE_INTERVAL_S = 5.0
_MAX_DATAGRAM = 1 << 20
_UDP_MAX = 65_000  # a publication larger than a UDP datagram cannot cross (thousands of endpoints)


@dataclass(frozen=True)
class ReplicaPeers:
    """Where the picker replicas are: every worker ``i`` of ``workers`` binds UDP ``bind_host:port + i`` and
    publishes to ``port + j`` (every worker ``j``) of each host of ``hosts`` (IP addresses or DNS names,
    with their own base port; a name may list several addresses)."""

    bind_host: str
    port: int
    hosts: tuple[tuple[str, int], ...]
    workers: int = 1


def parse_peers(value: str, default_port: int) -> tuple[tuple[str, int], ...]:
    """``HOST[:PORT][,HOST[:PORT]...]`` (``[v6]:PORT`` for IPv6); ``ValueError`` naming a bad entry."""
    hosts: list[tuple[str, int]] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, port = item, default_port
        if item.startswith("["):
            end = item.find("]")
            if end < 0:
                raise ValueError(f"{item!r}: an IPv6 address needs its closing ']'")
            host, rest = item[1:end], item[end + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"{item!r}: expected ':PORT' after the address")
                port = _port(item, rest[1:])
        elif item.count(":") == 1:
            host, text = item.split(":")
            port = _port(item, text)
        if not host:
            raise ValueError(f"{item!r}: no host")
        hosts.append((host, port))
    if not hosts:
        raise ValueError("no peer host given")
    return tuple(hosts)


def _port(item: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{item!r}: the port must be 1-65535")
    return int(text)


class _Wire(msgspec.Struct, array_like=True):
    picker: str
    epoch: int
    seq: int
    counts: dict[str, tuple[int, int, int, int]]
    candidate: str = ""  # last, with a default: a publication of an older picker still decodes


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Wire)


def encode(publication: InFlightPublication) -> bytes:
    return _ENCODER.encode(
        _Wire(
            publication.picker,
            publication.epoch,
            publication.seq,
            dict(publication.counts),
            publication.candidate,
        )
    )


def decode(data: bytes) -> InFlightPublication:
    """A publication from its datagram; ``ValueError`` naming what is wrong."""
    try:
        wire = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not an in-flight publication: {exc}") from None
    return InFlightPublication(wire.picker, wire.epoch, wire.seq, wire.counts, wire.candidate)


class InFlightSharing:
    """Worker ``index`` of ``workers`` (``directory``: the pod's worker sockets; None with one worker), and
    with ``replicas`` one picker among replicas: publishes its tracker's counts, folds the others' into its
    pool."""

    def __init__(
        self,
        tracker: InFlightTracker,
        clock: Clock,
        directory: Path | None,
        index: int,
        workers: int,
        *,
        replicas: ReplicaPeers | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        ttl_s: float = TTL_S,
    ) -> None:
        self._tracker = tracker
        self._directory = directory
        self._index = index
        self._peers: list[str] = []
        if directory is not None:
            self._peers = [str(directory / f"{i}.sock") for i in range(workers) if i != index]
        self._replicas = replicas
        self._heartbeat_s = heartbeat_s
        self.board = SharedInFlightBoard(ttl_s, clock)
        # The epoch grows across a worker's lives: its start time. Replicas' workers share indexes: the id
        # names the host (the pod) and the process.
        name = f"worker-{index}" if replicas is None else f"{socket.gethostname()}-{os.getpid()}"
        self.view = SharedInFlightView(tracker.pool, name, epoch=time.time_ns())
        self._socket: socket.socket | None = None
        self._udp: socket.socket | None = None
        self._replica_addresses: list[tuple[str, int]] = []
        self._resolver: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._publish_scheduled = False
        self._bad_peers: set[str] = set()
        self.rejected = 0  # datagrams that did not decode

    @property
    def path(self) -> Path:
        assert self._directory is not None
        return self._directory / f"{self._index}.sock"

    @property
    def replica_addresses(self) -> list[tuple[str, int]]:
        """The replicas' worker addresses last resolved (this picker's own among them, when listed)."""
        return list(self._replica_addresses)

    def start(self) -> None:
        """Bind, publish, and start the heartbeat (and the replicas' resolution); ``OSError`` if a socket
        cannot be bound."""
        self._loop = loop = asyncio.get_running_loop()
        if self._directory is not None:
            path = self.path
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a dead life's socket file
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(str(path))
            sock.setblocking(False)
            self._socket = sock
            loop.add_reader(sock.fileno(), self._readable, sock)
        replicas = self._replicas
        if replicas is not None:
            family = socket.AF_INET6 if ":" in replicas.bind_host else socket.AF_INET
            udp = socket.socket(family, socket.SOCK_DGRAM)
            try:
                udp.bind((replicas.bind_host, replicas.port + self._index))
            except OSError:
                udp.close()
                raise
            udp.setblocking(False)
            self._udp = udp
            loop.add_reader(udp.fileno(), self._readable, udp)
            self._resolver = loop.create_task(self._resolve_replicas(replicas), name="replica-peers")
        self._tracker.on_change = self._changed
        self._publish()
        self._timer = loop.call_later(self._heartbeat_s, self._tick)

    def stop(self) -> None:
        """Publish empty counts (the others drop this worker's load at once), then close."""
        if self._loop is None:
            return
        self._tracker.on_change = None
        last = self.view.publication()  # for its sequence number: the empty one is newer than any before
        self._send(encode(InFlightPublication(last.picker, last.epoch, last.seq, {})))
        if self._timer is not None:
            self._timer.cancel()
        if self._resolver is not None:
            self._resolver.cancel()
            self._resolver = None
        for sock in (self._socket, self._udp):
            if sock is not None:
                self._loop.remove_reader(sock.fileno())
                sock.close()
        if self._socket is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._socket = self._udp = None
        self._loop = None
        self.view.detach()

    async def _resolve_replicas(self, replicas: ReplicaPeers) -> None:
        assert self._loop is not None
        unresolved: set[str] = set()
        while True:
            addresses: list[tuple[str, int]] = []
            for host, port in replicas.hosts:
                try:
                    infos = await self._loop.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
                except OSError as exc:
                    if host not in unresolved:
                        unresolved.add(host)
                        log.warning("in-flight sharing: replica host %s does not resolve: %s", host, exc)
                    continue
                unresolved.discard(host)
                for ip in sorted({str(info[4][0]) for info in infos}):
                    addresses += [(ip, port + j) for j in range(replicas.workers)]
            if addresses or not self._replica_addresses:
                self._replica_addresses = addresses
            await asyncio.sleep(RESOLVE_INTERVAL_S)

    def _changed(self) -> None:
        if not self._publish_scheduled and self._loop is not None:
            self._publish_scheduled = True
            self._loop.call_soon(self._publish)

    def _publish(self) -> None:
        self._publish_scheduled = False
        if self._loop is not None:
            self._send(encode(self.view.publication()))

    def _send(self, data: bytes) -> None:
        if self._socket is not None:
            for path in self._peers:
                self._send_to(self._socket, data, path)
        if self._udp is not None and len(data) <= _UDP_MAX:
            for address in self._replica_addresses:
                self._send_to(self._udp, data, address)

    def _send_to(self, sock: socket.socket, data: bytes, peer: str | tuple[str, int]) -> None:
        try:
            sock.sendto(data, peer)
        except (FileNotFoundError, ConnectionRefusedError, BlockingIOError):
            pass  # not listening yet (starting, restarting) or its queue is full: the next one counts
        except OSError as exc:
            if str(peer) not in self._bad_peers:
                self._bad_peers.add(str(peer))
                log.warning("in-flight publication to %s failed: %s", peer, exc)

    def _readable(self, sock: socket.socket) -> None:
        taken = False
        while True:
            try:
                data = sock.recv(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError, ConnectionRefusedError):
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
