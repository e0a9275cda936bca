"""One subscriber per model server that publishes KV events: SUB on its publisher, replay on its ROUTER.

The subscriber applies each batch to the shared ``KVBlockIndex`` in sequence order and keeps the index
right when the stream is not:

- **Gap** (a sequence number skipped, e.g. the PUB socket dropped at its high-water mark): ask the replay
  socket for the missing batches (a DEALER sends ``[b"", start seq]``, the publisher answers
  ``[b"", seq, payload]`` per buffered batch, then the end marker) and apply them before the new one. If the
  replay does not cover the gap (the buffer moved on, no replay endpoint, no answer within
  ``replay_timeout_s``), the pod's blocks are cleared: an index that missed removals would send requests to
  blocks the pod no longer has. Counted as ``gaps``, ``replays`` and ``unrecovered``.
- **Joining**: on its first connection the subscriber asks the replay socket for everything from 0 and
  applies it before reading the PUB socket, so a router that starts after its pods knows what they cached
  before (as far as the publisher's buffer reaches) without waiting for their next event (a SUB socket
  drops what was published before it connected). Batches that then also arrive on the PUB socket are
  skipped, for ``replay_timeout_s``. Without a replay answer, the first batch with a sequence number
  above 0 triggers the same replay from 0. When no batch has come ``replay_timeout_s`` after a connection,
  the replay socket is asked once more for what follows the last batch applied: a SUB socket also drops
  what is published before its subscription reaches the publisher, and a batch lost so and followed by no
  other would otherwise stay unknown.
- **Restart** (the sequence number goes back): the publisher's engine started over with an empty cache; the
  pod's blocks are cleared and the new publisher's batches before this one are asked of the replay socket
  (a SUB socket reconnecting to it drops those). A restart the scrape shows (``KVTrustMonitor``: the
  pod's blocks cleared for ``process-restart``) is handled alike at the next batch: the publisher's
  batches from 0 are replayed first, whatever of them was applied before the clear. A batch whose number
  is not above the last one's and whose timestamp is older than the last one's is no restart but a late
  copy (delivered out of order, after its gap was replayed): skipped, counted as ``late``.
- **Malformed** frames or payloads (``KVEventDecodeError``): counted in ``decode_errors`` and treated as an
  unrecoverable gap; nothing a publisher sends can stop the subscriber.
- **Failure** of the session (a ZMQ error): the sockets are closed and reopened after ``reconnect_s``.

``KVSubscriberSet`` keeps one subscriber per address for a pool whose members come and go (discovery):
a subscriber whose address leaves, or whose pod or publisher changes, is stopped and the address's entry in
the index (blocks, claims, counters) is dropped before any new subscriber for it starts; a new pod at an
address that had one starts ``rebuilding`` (reason ``identity``).

**Trust** (``slorouter.pool.kv_trust``): the subscriber tells the pod's trust state machine of each gap
(open until replayed), each failed session (until the next one is in step), each clear and why, and each
live batch with its lag behind the router's wall clock (the batch's ``ts`` is the publisher's wall time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import zmq
import zmq.asyncio

from slorouter.clock import Clock, WallClock
from slorouter.kvevents.wire import (
    KVEventBatch,
    KVEventDecodeError,
    decode_batch,
    parse_message,
    parse_seq,
    seq_frame,
)
from slorouter.pool.config import PoolConfig
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_trust import TrustReason

logger = logging.getLogger(__name__)
EVERY_SEQ = 1 << 63  # the end of a replay that asks for all the publisher has


@dataclass(frozen=True, slots=True)
class PublisherAddress:
    """Where one model server publishes: its PUB endpoint, its replay ROUTER (optional), the topic prefix."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


class KVEventSubscriber:
    def __init__(
        self,
        address: str,
        publisher: PublisherAddress,
        index: KVBlockIndex,
        *,
        replay_timeout_s: float = 1.0,
        reconnect_s: float = 1.0,
        wall_clock: Clock | None = None,
    ) -> None:
        self.address = address
        self.publisher = publisher
        self.index = index
        self.stats = index.pod_stats(address)
        self.replay_timeout_s = replay_timeout_s
        self.reconnect_s = reconnect_s
        self.trust = index.pod_trust(address)
        self.wall_clock: Clock = wall_clock or WallClock()
        self._ctx = zmq.asyncio.Context.instance()
        self._last_seq: int | None = None
        self._last_ts = float("-inf")  # of the last live batch applied
        self._process_restarts = 0  # the pod's clears for a process restart already followed
        # After joining: PUB batches up to this sequence number are the replay's again, until the deadline.
        self._joined_through: int | None = None
        self._joined_deadline = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"kv-events-{self.address}")

    async def stop(self) -> None:
        task = self.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def cancel(self) -> asyncio.Task[None] | None:
        """Stop at once: nothing reaches the index after this (the task closes its sockets as it ends);
        returns the task to await, if it was running."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def run(self) -> None:
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.stats.reconnects += 1
                self.trust.session_failed(self.index.clock.now())
                logger.exception("KV events of %s: session failed; reconnecting", self.address)
            await asyncio.sleep(self.reconnect_s)

    async def _session(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.IPV6, 1)  # a pod's IP may be IPv6; IPv4 addresses still connect
        try:
            sub.setsockopt(zmq.SUBSCRIBE, self.publisher.topic.encode())
            sub.connect(self.publisher.endpoint)
            if self._last_seq is None:
                await self._join()
            # A SUB socket drops what is published before its subscription reaches the publisher. A batch
            # published in that moment and followed by no other (which would show the gap) is fetched by
            # asking the replay socket again once the subscription has settled, unless a batch came first.
            loop = asyncio.get_running_loop()
            settled_at: float | None = loop.time() + self.replay_timeout_s
            while True:
                if settled_at is None:
                    frames = await sub.recv_multipart()
                else:
                    try:
                        left = max(0.0, settled_at - loop.time())
                        frames = await asyncio.wait_for(sub.recv_multipart(), left)
                    except TimeoutError:
                        settled_at = None
                        await self._join()
                        continue
                    settled_at = None
                await self.receive(frames)
        finally:
            sub.close(linger=0)

    async def _join(self) -> None:
        """Apply what the publisher's replay buffer holds past the last batch applied (nothing without a
        replay endpoint or answer)."""
        start = 0 if self._last_seq is None else self._last_seq + 1
        batches = await self._replay(start, EVERY_SEQ)
        if batches is None:
            return
        self.trust.in_step(self.index.clock.now())
        if not batches:
            return
        if start > 0 and batches[0][0] != start:
            self._lost(f"batches from {start} missed and not replayed", TrustReason.UNRECOVERED_GAP)
        for _, batch in batches:
            self.index.apply(self.address, batch)
        self._last_seq = self._joined_through = batches[-1][0]
        self._joined_deadline = asyncio.get_running_loop().time() + self.replay_timeout_s

    async def receive(self, frames: list[bytes]) -> None:
        """Handle one published message (public for tests that feed frames directly)."""
        try:
            _, seq, payload = parse_message(frames)
        except KVEventDecodeError as exc:
            self._lost(f"unreadable message: {exc}", TrustReason.DECODE_ERROR)
            return
        if self.trust.clears[TrustReason.PROCESS_RESTART] != self._process_restarts:
            self._process_restarts = self.trust.clears[TrustReason.PROCESS_RESTART]
            self._last_seq = self._joined_through = None  # learn the new process's stream from its start
        if self._joined_through is not None:
            if seq <= self._joined_through and asyncio.get_running_loop().time() < self._joined_deadline:
                return  # published while the replay was read: already applied
            self._joined_through = None
        last = self._last_seq
        if last is None:
            if seq > 0:
                await self._recover(0, seq, gap=False)
        elif seq <= last:
            if self._late(payload):
                self.stats.late += 1
                return
            self.stats.restarts += 1
            self.index.clear_pod(self.address, TrustReason.SEQUENCE_RESTART)
            if seq > 0:
                await self._recover(0, seq, gap=False)
        elif seq > last + 1:
            await self._recover(last + 1, seq, gap=True)
        self._last_seq = seq
        self._apply(payload)

    def _late(self, payload: bytes) -> bool:
        """Whether a batch numbered at or below the last one is older than it (reordered, not restarted)."""
        try:
            return decode_batch(payload).ts < self._last_ts
        except KVEventDecodeError:
            return False  # left to _apply, which counts it

    def _apply(self, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except KVEventDecodeError as exc:
            self._lost(str(exc), TrustReason.DECODE_ERROR)
            return
        self.index.apply(self.address, batch)
        self._last_ts = batch.ts
        now = self.index.clock.now()
        self.trust.in_step(now)
        self.trust.batch(now, lag_s=self.wall_clock.now() - batch.ts, events=len(batch.events))

    def _lost(self, why: str, reason: TrustReason) -> None:
        if reason is TrustReason.DECODE_ERROR:
            self.stats.decode_errors += 1
        else:
            self.stats.unrecovered += 1
        logger.warning("KV events of %s: %s; clearing its blocks", self.address, why)
        self.index.clear_pod(self.address, reason)

    async def _recover(self, start: int, upto: int, *, gap: bool) -> None:
        """Apply batches ``start``..``upto - 1`` from the replay socket, or clear the pod if it cannot."""
        if gap:
            self.stats.gaps += 1
            self.trust.gap_opened(self.index.clock.now())
        batches = await self._replay(start, upto)
        if batches is None or not batches or batches[0][0] != start:
            if gap:
                self._lost(
                    f"batches {start}..{upto - 1} missed and not replayed", TrustReason.UNRECOVERED_GAP
                )
            else:  # joined late and the buffer does not reach back to 0: take what it has
                for _, batch in batches or []:
                    self.index.apply(self.address, batch)
            return
        expected = start
        for seq, batch in batches:
            if seq != expected:
                self._lost(f"replay skipped from {expected} to {seq}", TrustReason.UNRECOVERED_GAP)
                return
            self.index.apply(self.address, batch)
            expected += 1
        if expected != upto:
            self._lost(f"replay ended at {expected - 1}, before {upto - 1}", TrustReason.UNRECOVERED_GAP)
            return
        if gap:
            self.stats.replays += 1
            self.trust.gap_closed(self.index.clock.now())

    async def _replay(self, start: int, upto: int) -> list[tuple[int, KVEventBatch]] | None:
        """The decoded batches ``start``..``upto - 1`` the publisher still has (None: no answer)."""
        if self.publisher.replay_endpoint is None:
            return None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IPV6, 1)
        batches: list[tuple[int, KVEventBatch]] = []
        try:
            dealer.connect(self.publisher.replay_endpoint)
            await dealer.send_multipart((b"", seq_frame(start)))
            while True:
                try:
                    frames = await asyncio.wait_for(dealer.recv_multipart(), self.replay_timeout_s)
                except TimeoutError:
                    return None
                if len(frames) != 3 or frames[0] != b"":
                    raise KVEventDecodeError(
                        f"a replay answer has 3 frames ('', seq, payload), got {len(frames)}"
                    )
                seq = parse_seq(frames[1])
                if not frames[2]:  # end of replay
                    return batches
                if start <= seq < upto:
                    batches.append((seq, decode_batch(frames[2])))
        except KVEventDecodeError as exc:
            self.stats.decode_errors += 1
            logger.warning("KV events of %s: bad replay: %s", self.address, exc)
            return None
        finally:
            dealer.close(linger=0)


def subscribers_from_config(config: PoolConfig, index: KVBlockIndex) -> list[KVEventSubscriber]:
    """One subscriber per endpoint with ``kv_events``."""
    return [
        KVEventSubscriber(
            endpoint.address,
            PublisherAddress(
                endpoint.kv_events.endpoint, endpoint.kv_events.replay_endpoint, endpoint.kv_events.topic
            ),
            index,
            replay_timeout_s=config.kv_events_replay_timeout_ms / 1000,
            reconnect_s=config.kv_events_reconnect_ms / 1000,
        )
        for endpoint in config.endpoints
        if endpoint.kv_events is not None
    ]


@dataclass(frozen=True, slots=True)
class Subscription:
    """What one address subscribes to: ``owner`` (the pod) and its publisher; a change of either starts a
    new subscriber (a new pod at an old IP is a new engine, whose blocks are not the old one's)."""

    owner: str
    publisher: PublisherAddress


class KVSubscriberSet:
    """Subscribers that follow ``update``: one per address of the last desired mapping."""

    def __init__(
        self, index: KVBlockIndex, *, replay_timeout_s: float = 1.0, reconnect_s: float = 1.0
    ) -> None:
        self.index = index
        self.replay_timeout_s = replay_timeout_s
        self.reconnect_s = reconnect_s
        self._running: dict[str, tuple[Subscription, KVEventSubscriber]] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._running)

    @property
    def subscriptions(self) -> dict[str, Subscription]:
        return {address: subscription for address, (subscription, _) in self._running.items()}

    def subscriber(self, address: str) -> KVEventSubscriber | None:
        entry = self._running.get(address)
        return None if entry is None else entry[1]

    @property
    def stopping(self) -> int:
        """Subscribers cancelled whose tasks have not ended yet."""
        return len(self._stopping)

    def update(self, desired: Mapping[str, Subscription]) -> tuple[list[str], list[str]]:
        """Start and stop subscribers so that exactly ``desired`` run (needs the running loop); returns the
        addresses (started, stopped)."""
        stopped = [a for a, (subscription, _) in self._running.items() if desired.get(a) != subscription]
        new_pods = set()
        for address in stopped:
            new = desired.get(address)
            if new is not None and new.owner != self._running[address][0].owner:
                new_pods.add(address)
            self._drop(address)
        started = []
        for address, subscription in desired.items():
            if address in self._running:
                continue
            subscriber = KVEventSubscriber(
                address,
                subscription.publisher,
                self.index,
                replay_timeout_s=self.replay_timeout_s,
                reconnect_s=self.reconnect_s,
            )
            if address in new_pods:  # another pod at this address: its blocks are learnt afresh
                self.index.clear_pod(address, TrustReason.IDENTITY)
            subscriber.start()
            self._running[address] = (subscription, subscriber)
            started.append(address)
            logger.info(
                "KV events of %s (%s): subscribed to %s",
                address,
                subscription.owner,
                subscription.publisher.endpoint,
            )
        return started, stopped

    def _drop(self, address: str) -> None:
        subscription, subscriber = self._running.pop(address)
        task = subscriber.cancel()
        if task is not None:
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        self.index.remove_pod(address)
        logger.info("KV events of %s (%s): unsubscribed", address, subscription.owner)

    async def stop(self) -> None:
        """Stop every subscriber and wait until their tasks (and sockets) are gone."""
        self.update({})
        await asyncio.gather(*self._stopping, return_exceptions=True)
