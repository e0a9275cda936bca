"""A ZMQ publisher of KV-event batches with a replay socket, on vLLM's ``ZmqEventPublisher`` protocol.

Each ``publish`` sends ``[topic, seq, payload]`` on a PUB socket and keeps ``(seq, payload)`` in a ring of
the last ``buffer_steps`` batches (``record`` and ``send`` are its two halves, for a caller that plays
faults: a batch left out of the ring, or sent late, or not at all); a ROUTER socket answers replay
requests (``[identity, b"", start seq]``) with every buffered batch from that sequence number on, then the
end marker. As in vLLM, an endpoint with
``*``, ``::``, ``ipc://`` or ``inproc://`` is bound and any other is connected to; the replay endpoint is
always bound (``bind=True`` binds the PUB endpoint too). Runs in the caller's asyncio loop (the simulated
pods'): publishing never blocks (PUB drops at its high-water mark, as ZMQ does), replay requests are served
by a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

import zmq
import zmq.asyncio

from slorouter.kvevents.wire import END_OF_REPLAY, KVEvent, KVEventBatch, encode_batch, parse_seq, seq_frame

logger = logging.getLogger(__name__)


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        data_parallel_rank: int = 0,
        bind: bool | None = None,
    ) -> None:
        self._ctx = zmq.asyncio.Context.instance()
        self._topic = topic.encode()
        self._rank = data_parallel_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        try:
            if bind if bind is not None else _binds(endpoint):
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self.endpoint = self._last_endpoint(self._pub)
        self.replay_endpoint = self._last_endpoint(self._replay) if self._replay is not None else None

    @staticmethod
    def _last_endpoint(socket: zmq.Socket[Any]) -> str:
        value = socket.getsockopt(zmq.LAST_ENDPOINT)
        return value.decode() if isinstance(value, bytes) else str(value)

    def start(self) -> None:
        """Serve replay requests (call from the event loop)."""
        if self._replay is not None and self._replay_task is None:
            self._replay_task = asyncio.create_task(self._serve_replay(), name="kv-events-replay")

    def publish(self, events: list[KVEvent], ts: float) -> int:
        """Send one batch; returns its sequence number."""
        seq, payload = self.record(events, ts)
        self.send(seq, payload)
        return seq

    def record(self, events: list[KVEvent], ts: float, *, replayable: bool = True) -> tuple[int, bytes]:
        """Number and encode one batch, and keep it for replay unless ``replayable`` is false."""
        seq = self._seq
        self._seq += 1
        payload = encode_batch(KVEventBatch(ts, events, self._rank))
        if replayable:
            self._buffer.append((seq, payload))
        return seq, payload

    def send(self, seq: int, payload: bytes) -> None:
        """Put a recorded batch on the PUB socket (nothing once closed)."""
        if self._pub.closed:
            return
        with contextlib.suppress(zmq.Again):  # PUB at its high-water mark drops; the buffer still replays it
            self._pub.send_multipart((self._topic, seq_frame(seq), payload), flags=zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        replay = self._replay
        assert replay is not None
        while True:
            frames = await replay.recv_multipart()
            if len(frames) != 3 or frames[1] != b"":
                logger.warning("ignoring a replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            try:
                start_seq = parse_seq(start)
            except ValueError as exc:
                logger.warning("ignoring a replay request: %s", exc)
                continue
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await replay.send_multipart((client, b"", seq_frame(seq), payload))
            await replay.send_multipart((client, b"", END_OF_REPLAY, b""))

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
            self._replay_task = None
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
