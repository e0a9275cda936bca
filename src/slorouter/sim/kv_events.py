"""The simulated engine's KV events: a recorder on its block manager that turns each step's prefix-cache
changes into vLLM's ``BlockStored`` / ``BlockRemoved`` events.

Consecutive blocks of one sequence stored in a row become one ``BlockStored`` (parent: the hash of the block
before the first, ``None`` for a sequence's first block), consecutive evictions one ``BlockRemoved``, as
vLLM's block pool reports them. ``drain`` returns the events since the last drain: one batch per step.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from slorouter.faults.plan import FaultPlan
from slorouter.kvevents.publisher import ZmqEventPublisher
from slorouter.kvevents.wire import MEDIUM_GPU, BlockRemoved, BlockStored, KVEvent
from slorouter.sim.engine import Engine
from slorouter.sim.faults import KV_EVENTS
from slorouter.sim.kv_cache import KVBlockManager, KVSequence

_TOKEN_DTYPE = np.dtype("<u4")


class KVEventRecorder:
    """Records a block manager's prefix-cache changes (attach with ``attach``).

    ``token_ids=False`` leaves ``BlockStored.token_ids`` empty: the in-process benchmark's index only reads
    hashes, and building token lists for every block would cost it more than the routing does.
    """

    __slots__ = ("_events", "_manager", "_run_end", "_run_seq", "_run_start", "token_ids")

    def __init__(self, manager: KVBlockManager, *, token_ids: bool = True) -> None:
        self._manager = manager
        self.token_ids = token_ids
        self._events: list[KVEvent] = []
        self._run_seq: KVSequence | None = None
        self._run_start = self._run_end = 0

    @classmethod
    def attach(cls, manager: KVBlockManager, *, token_ids: bool = True) -> KVEventRecorder:
        recorder = cls(manager, token_ids=token_ids)
        manager.events = recorder
        return recorder

    def stored(self, seq: KVSequence, j: int) -> None:
        if self._run_seq is seq and j == self._run_end:
            self._run_end = j + 1
            return
        self._flush()
        self._run_seq, self._run_start, self._run_end = seq, j, j + 1

    def removed(self, block_hash: int) -> None:
        self._flush()
        events = self._events
        if events and isinstance(events[-1], BlockRemoved):
            events[-1].block_hashes.append(block_hash)
        else:
            events.append(BlockRemoved([block_hash], MEDIUM_GPU))

    def drain(self) -> list[KVEvent]:
        """The events since the last call, in order."""
        self._flush()
        events, self._events = self._events, []
        return events

    def _flush(self) -> None:
        seq = self._run_seq
        if seq is None:
            return
        self._run_seq = None
        start, end = self._run_start, self._run_end
        manager = self._manager
        tokens: list[int] = []
        if self.token_ids:
            data = b"".join(manager.block_bytes(seq, j) for j in range(start, end))
            tokens = np.frombuffer(data, dtype=_TOKEN_DTYPE).tolist()
        parent = seq.block_hashes[start - 1] if start else None
        self._events.append(
            BlockStored(
                seq.block_hashes[start:end], parent, tokens, manager.block_size, None, MEDIUM_GPU, None
            )
        )


class PodKVEvents:
    """A simulated pod's KV-event publishing: its engine's recorder and the ZMQ publisher of its batches,
    which plays the pod's ``kv-events`` faults (``slorouter.sim.faults``) on each batch."""

    def __init__(self, engine: Engine, publisher: ZmqEventPublisher, faults: FaultPlan | None = None) -> None:
        self.recorder = KVEventRecorder.attach(engine.kv_blocks)
        self.publisher = publisher
        self.faults = faults
        self._held: tuple[int, bytes] | None = None  # a batch kv-events-reorder holds back
        self._late: set[asyncio.TimerHandle] = set()  # batches kv-events-delay sends later

    def flush(self) -> None:
        """Publish what the engine changed since the last flush (called after every step)."""
        events = self.recorder.drain()
        if not events:
            return
        fault = self.faults.draw(KV_EVENTS) if self.faults else None
        publisher = self.publisher
        replayable = fault is None or fault.name != "kv-events-drop" or bool(fault.param("replayable"))
        seq, payload = publisher.record(events, time.time(), replayable=replayable)
        held, self._held = self._held, None
        if fault is None:
            publisher.send(seq, payload)
        elif fault.name == "kv-events-delay":
            self._send_later(fault.param("delay_s"), seq, payload)
        elif fault.name == "kv-events-reorder":
            self._held = (seq, payload)
        if held is not None:
            publisher.send(*held)

    def _send_later(self, delay_s: float, seq: int, payload: bytes) -> None:
        def send() -> None:
            self._late.discard(handle)
            self.publisher.send(seq, payload)

        handle = asyncio.get_running_loop().call_later(delay_s, send)
        self._late.add(handle)

    async def close(self) -> None:
        for handle in self._late:
            handle.cancel()
        self._late.clear()
        await self.publisher.close()
