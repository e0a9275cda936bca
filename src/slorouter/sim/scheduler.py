"""Batch scheduler policies: in which order an engine step takes decodes, running prefills and new requests.

Each policy is a small strategy that calls the engine's three batch phases (``Engine.schedule_decodes``,
``schedule_prefills``, ``admit_waiting``); the phases own the block accounting and the preemption.

- ``vllm`` (the default): vLLM V1. Decodes first, then running prefills (a chunk that finds no free block
  preempts the newest running request, decoding or not), then waiting requests FCFS, all in one step.
- ``decode-priority``: decodes first, and never preempted while a prefill holds blocks: a decode that needs
  a block takes it from the newest prefilling request first; prefills get the leftover budget and, when
  blocks run out, may only preempt newer prefills, else they wait (as do new requests). No running decode
  ever misses a step because of a prefill.
- ``prefill-priority``: vLLM V0's default scheduler and SGLang's (without mixed chunks). Whenever a prefill
  can run (a chunked prompt in progress, or a waiting request that fits), the step is prefill-only, with
  the whole budget, and the decodes are paused; decodes run only in steps without prefill work.

Under the priority queue (engine variant ``queue=priority``) "waiting requests" are taken by priority,
and "the newest" victim is the one with the largest (priority, arrival), in every policy
(``slorouter.sim.engine``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from slorouter.sim.engine import Batch, Engine


class SchedulerPolicy(Protocol):
    name: str

    def plan(self, engine: Engine, batch: Batch, now: float) -> None:
        """Fill ``batch`` by calling the engine's batch phases."""


class VllmPolicy:
    name = "vllm"

    def plan(self, engine: Engine, batch: Batch, now: float) -> None:
        engine.schedule_decodes(batch)
        engine.schedule_prefills(batch)
        # After a preemption new requests wait, unless the step would otherwise be empty.
        if engine.num_waiting and (not batch.preempted(engine) or not (batch.chunks or engine.num_decoding)):
            engine.admit_waiting(batch, now)


class DecodePriorityPolicy:
    name = "decode-priority"

    def plan(self, engine: Engine, batch: Batch, now: float) -> None:
        engine.schedule_decodes(batch, spare_decodes=True)
        engine.schedule_prefills(batch, spare_decodes=True)
        if engine.num_waiting and not batch.stalled and not batch.preempted(engine):
            engine.admit_waiting(batch, now)


class PrefillPriorityPolicy:
    name = "prefill-priority"

    def plan(self, engine: Engine, batch: Batch, now: float) -> None:
        engine.schedule_prefills(batch)
        if engine.num_waiting and not batch.preempted(engine):
            engine.admit_waiting(batch, now)
        if not batch.chunks:
            engine.schedule_decodes(batch)


POLICIES: dict[str, SchedulerPolicy] = {
    policy.name: policy for policy in (VllmPolicy(), DecodePriorityPolicy(), PrefillPriorityPolicy())
}


def get_policy(name: str) -> SchedulerPolicy:
    """The policy called ``name``; ``ValueError`` naming the valid ones otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown scheduler policy {name!r}; valid policies: {', '.join(POLICIES)}"
        ) from None
