"""A vLLM-V1-like inference engine as a pure state machine (no clock reads, no asyncio).

The caller owns time: it adds requests at a time, asks for the next step at a time (``plan_step``), waits
``step.duration`` (really, or in virtual time) and applies it (``commit_step``). The real-time HTTP server
and the discrete-event cluster simulator drive this same class.

What it models, after vLLM V1's scheduler and KV-cache manager:

- **Continuous batching** with a token budget per step (``max_num_batched_tokens``) and at most
  ``max_num_seqs`` running requests; an FCFS waiting queue, or (profile ``scheduling_policy="priority"``)
  vLLM's priority queue (below).
- **Chunked prefill**: a prompt is computed over as many steps as the budget needs (and, with
  ``long_prefill_token_threshold``, at most that many tokens per step). Under the default ``vllm`` policy
  decodes are scheduled first (the budget always covers them since it is at least ``max_num_seqs``), then
  running prefills in admission order, then waiting requests; ``slorouter.sim.scheduler`` has the others.
- **Paged KV cache** of ``num_gpu_blocks`` blocks of ``block_size`` tokens, allocated as tokens are scheduled,
  with **automatic prefix caching**: a new request reuses the longest cached run of its leading full blocks
  and skips computing them (``slorouter.sim.kv_cache`` keeps the blocks; this module decides who gets them).
- **Preemption by recompute**: when a running request needs a block and none is free, the most recently
  admitted running request loses all its blocks and goes back to the front of the waiting queue.
- **Priority scheduling** (vLLM's ``--scheduling-policy priority``), copied from vLLM V1's
  ``PriorityRequestQueue`` (``vllm/v1/core/sched/request_queue.py``) and ``Scheduler.schedule``
  (``vllm/v1/core/sched/scheduler.py``): the waiting queue is a heap ordered by ``(priority, arrival)``,
  lower first (``Request.__lt__``); a preempted request is pushed back into it (``prepend_request`` of the
  priority queue is ``add_request``) and keeps its priority and arrival; the preemption victim is
  ``max(running, key=(priority, arrival))`` rather than the newest, and a victim already scheduled in the
  step being built gives its tokens back to the budget. As in vLLM the head of the queue still blocks
  the queue when it does not fit, and waiting requests never preempt running ones. One deviation: equal
  ``(priority, arrival)`` pairs are ordered by arrival order at the engine (vLLM's queue compares request
  ids, and its victim is the earliest admitted of them). The ``decode-priority`` policy, which only
  preempts prefills, takes the prefilling request with the largest key. With the default ``fcfs`` the
  priority given to ``add_request`` is ignored.
- **Stalls and slow periods** (``slorouter.sim.disruptions``): pauses during which no step runs, and
  periods during which every step takes a factor longer, on a schedule seeded per engine.
- **Output length** is exactly ``max_tokens`` (as with ``ignore_eos``).
- **Step time** from the profile's latency model, times seeded lognormal jitter; per-request API overheads
  before the queue (``api_pre``) and after the last token (``api_post`` + ``api_per_token`` per output token).

Decodes cost O(1) per step each, not O(tokens): a decoding request advances implicitly with the step counter
and is only touched when it needs a new KV block (every ``block_size`` tokens) or finishes.
"""

from __future__ import annotations

import heapq
import math
import operator
import random
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from slorouter.sim.disruptions import Disruptions, disrupted
from slorouter.sim.kv_cache import KVBlockManager, KVSequence
from slorouter.sim.profiles import Profile
from slorouter.sim.scheduler import get_policy
from slorouter.tokenizer import BYTES_PER_TOKEN, token_ids_to_bytes

RequestId = Hashable

# Request states.
PENDING, WAITING, PREFILL, DECODE, FINISHED, ABORTED = range(6)


class RequestRejected(ValueError):
    """A request the engine can never serve (empty, too long for the model or the KV cache, ...)."""


@dataclass(frozen=True, slots=True)
class FirstToken:
    """A request produced its first output token."""

    request_id: RequestId
    time: float
    arrival_time: float
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache at first scheduling

    @property
    def ttft(self) -> float:
        return self.time - self.arrival_time


@dataclass(frozen=True, slots=True)
class Finished:
    """A request produced its last token. ``done_time`` adds the API overheads: when the client has it all."""

    request_id: RequestId
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    arrival_time: float
    queued_time: float  # entered the waiting queue (arrival + api_pre)
    scheduled_time: float  # first scheduled
    first_token_time: float
    finish_time: float
    done_time: float
    num_preemptions: int

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float:
        return self.done_time - self.arrival_time

    @property
    def queue_time(self) -> float:
        return self.scheduled_time - self.queued_time


@dataclass(slots=True)
class StepOutput:
    """What one committed step produced."""

    time: float
    tokens: list[RequestId]  # requests that got one more output token (first tokens included); [] when
    # the engine was created with report_tokens=False
    first_tokens: list[FirstToken]
    finished: list[Finished]


@dataclass(slots=True, eq=False)
class Step:
    """A planned step: the batch is fixed and its KV blocks are allocated; ``commit_step`` applies it."""

    index: int
    start: float
    duration: float  # seconds
    num_decodes: int
    num_prefill_tokens: int
    num_preempted: int
    _chunks: list[tuple[_Request, int]] = field(repr=False)
    _finishing: list[_Request] = field(repr=False)
    _decode_index: int = field(repr=False)  # the engine's decode clock at planning
    _decodes: bool = field(repr=False)  # the decoding requests run in this step

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(slots=True, eq=False)
class Batch:
    """The step a scheduler policy is building (``Engine.plan_step``)."""

    index: int  # the decode clock: decoding requests' progress is measured in it
    budget: int  # tokens still schedulable
    preemptions_before: int
    chunks: list[tuple[_Request, int]] = field(default_factory=list)
    finishing: list[_Request] = field(default_factory=list)
    pairs: float = 0.0  # Σ over prefill chunks of n·(s + n/2)
    decodes: bool = False  # schedule_decodes ran: the decoding requests are in the step
    stalled: bool = False  # a prefill waits for blocks it may not take

    def preempted(self, engine: Engine) -> int:
        return engine.num_preemptions_total - self.preemptions_before


class _Request(KVSequence):
    __slots__ = (
        "arrival",
        "cached_tokens",
        "dec_computed",
        "dec_output",
        "dec_step",
        "finish_step",
        "first_token_time",
        "max_tokens",
        "next_event",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_tokens",
        "order",
        "priority",
        "queued",
        "request_id",
        "run_seq",
        "scheduled_time",
        "state",
    )

    def __init__(
        self,
        request_id: RequestId,
        prompt_bytes: bytes,
        block_hashes: list[int],
        max_tokens: int,
        arrival: float,
        priority: int,
        order: int,
    ) -> None:
        super().__init__(prompt_bytes, block_hashes)
        self.request_id = request_id
        self.max_tokens = max_tokens
        self.arrival = arrival
        self.priority = priority  # vLLM's request priority: lower is served first (priority queue only)
        self.order = order  # arrival order at the engine: breaks (priority, arrival) ties
        self.queued = arrival
        self.state = PENDING
        self.num_tokens = self.prompt_len  # prompt + output tokens known so far
        self.num_computed = 0  # KV-computed tokens (stale while decoding: see _sync_decode)
        self.num_output = 0
        self.cached_tokens = -1
        self.scheduled_time = -1.0
        self.first_token_time = -1.0
        self.num_preemptions = 0
        self.run_seq = 0  # admission order into the running set
        self.dec_step = self.dec_computed = self.dec_output = 0  # decode progress at step dec_step
        self.finish_step = self.next_event = -1


class _WaitingQueue(Protocol):
    """The waiting queue's operations: a ``deque`` (FCFS) or a ``_PriorityQueue``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> _Request: ...

    def append(self, req: _Request, /) -> None: ...

    def appendleft(self, req: _Request, /) -> None: ...

    def popleft(self) -> _Request: ...

    def remove(self, req: _Request, /) -> None: ...


class _PriorityQueue:
    """vLLM V1's ``PriorityRequestQueue``: a heap by ``(priority, arrival)``, ties by arrival order, with the
    deque operations the engine uses (``append`` and ``appendleft`` both push; ``[0]`` is the head)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, _Request]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def __getitem__(self, index: int, /) -> _Request:
        if index != 0:
            raise IndexError("a priority queue only shows its head")
        return self._heap[0][3]

    def append(self, req: _Request, /) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival, req.order, req))

    appendleft = append  # vLLM: "In a priority queue, there is no concept of prepending to the front."

    def popleft(self) -> _Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: _Request, /) -> None:
        heap = self._heap
        for i, entry in enumerate(heap):
            if entry[3] is req:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return
        raise ValueError("the request is not waiting")


class Engine:
    """One simulated model server's engine. Not thread-safe; times are seconds on the caller's time line."""

    def __init__(
        self,
        profile: Profile,
        *,
        seed: int = 0,
        jitter_sigma: float | None = None,
        report_tokens: bool = True,
        start_time: float = 0.0,
    ) -> None:
        """``report_tokens=False`` leaves ``StepOutput.tokens`` empty, for callers that only need first
        tokens and ends (the discrete-event simulator): listing a whole decode batch every step costs.
        ``start_time`` is where the engine's time line starts: a profile's stalls and slow periods are drawn
        from there on (``seed`` seeds them as it seeds the step jitter)."""
        if profile.max_num_batched_tokens < profile.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs (decodes must fit a step)")
        self.profile = profile
        self.block_size = profile.block_size
        self.num_gpu_blocks = profile.num_gpu_blocks
        self.max_model_len = profile.max_model_len
        self._gauss = random.Random(seed).gauss
        self._sigma = profile.jitter_sigma if jitter_sigma is None else jitter_sigma
        self._jitter_shift = 0.5 * self._sigma**2
        self._report_tokens = report_tokens
        self._api_pre = profile.api_pre_ms / 1000.0
        self._api_post = profile.api_post_ms / 1000.0
        self._api_per_token = profile.api_per_token_ms / 1000.0

        self._requests: dict[RequestId, _Request] = {}
        self._pending: list[tuple[float, int, _Request]] = []  # heap by ready time
        self._pending_seq = 0
        self._by_priority = profile.scheduling_policy == "priority"
        self._waiting: _WaitingQueue = _PriorityQueue() if self._by_priority else deque()
        self._running: dict[RequestId, _Request] = {}  # admission order
        self._prefilling: list[_Request] = []
        self._decoding: dict[RequestId, _Request] = {}
        self._due: dict[int, list[_Request]] = {}  # step index -> decoding requests to look at then
        self._decode_context = 0  # Σ computed tokens over decoding requests
        self._run_seq = 0
        self._steps_done = 0
        # Decode progress is counted in steps that ran the decodes: every step, unless the policy pauses
        # them (prefill-priority).
        self._decode_clock = 0
        self._policy = get_policy(profile.scheduler)
        self._inflight: Step | None = None
        # Stalls and slow periods (None without either: the step path does not look further).
        self._disruptions = Disruptions(profile, seed, start_time) if disrupted(profile) else None
        self._resume_at: float | None = None  # the end of the stall that made plan_step return None

        self._kv = KVBlockManager(self.num_gpu_blocks, self.block_size)

        self.prefix_cache_queries = 0  # tokens looked up (vLLM counts tokens)
        self.prefix_cache_hits = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_preemptions_total = 0
        self.num_finished_total = 0

    # ----------------------------------------------------------------------------------------- gauges

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_pending(self) -> int:
        """Requests still in their API overhead, not yet in the waiting queue."""
        return sum(1 for _, _, req in self._pending if req.state == PENDING)

    @property
    def num_free_blocks(self) -> int:
        return self._kv.num_free_blocks

    @property
    def kv_blocks(self) -> KVBlockManager:
        """The block manager (a KV-event recorder attaches to it)."""
        return self._kv

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks referenced by requests (cached but unreferenced blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_gpu_blocks

    @property
    def steps_done(self) -> int:
        return self._steps_done

    def has_work(self) -> bool:
        return bool(self._running or self._waiting) or self.next_ready_time() is not None

    def next_ready_time(self) -> float | None:
        """When an idle engine must be asked again (None: never, until a request is added): the earliest
        request still in its API overhead reaches the waiting queue, or the stall that keeps the engine's
        requests waiting ends."""
        pending = self._pending
        while pending and pending[0][2].state != PENDING:
            heapq.heappop(pending)
        ready = pending[0][0] if pending else None
        resume = self._resume_at
        if resume is not None and (self._running or self._waiting) and (ready is None or resume < ready):
            return resume
        return ready

    # --------------------------------------------------------------------------------------- requests

    def add_request(
        self,
        request_id: RequestId,
        prompt_token_ids: Sequence[int] | np.ndarray | bytes,
        max_tokens: int,
        now: float,
        priority: int = 0,
    ) -> None:
        """Accept a request arriving at ``now``; it reaches the waiting queue ``api_pre`` later.

        ``prompt_token_ids`` may also be the packed little-endian uint32 bytes of the ids. ``priority`` is
        vLLM's request priority (lower first), used by the priority queue and ignored by FCFS. Raises
        ``RequestRejected`` for requests the engine can never serve and ``ValueError`` for a duplicate id.
        """
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already in the engine")
        if isinstance(prompt_token_ids, bytes):
            if len(prompt_token_ids) % BYTES_PER_TOKEN:
                raise RequestRejected("packed token ids must be 4 bytes each")
            prompt = prompt_token_ids
        else:
            try:
                prompt = token_ids_to_bytes(prompt_token_ids)
            except (OverflowError, ValueError) as exc:
                raise RequestRejected("token ids must be integers in [0, 2**32)") from exc
        prompt_len = len(prompt) // BYTES_PER_TOKEN
        if prompt_len == 0:
            raise RequestRejected("the prompt is empty")
        if max_tokens < 1:
            raise RequestRejected(f"max_tokens must be at least 1, got {max_tokens}")
        if prompt_len + max_tokens > self.max_model_len:
            raise RequestRejected(
                f"prompt ({prompt_len}) + max_tokens ({max_tokens}) > max_model_len ({self.max_model_len})"
            )
        if -(-(prompt_len + max_tokens) // self.block_size) > self.num_gpu_blocks:
            raise RequestRejected("the request needs more KV blocks than the engine has")
        self._pending_seq += 1
        req = _Request(
            request_id,
            prompt,
            self._kv.prompt_block_hashes(prompt),
            max_tokens,
            now,
            priority,
            self._pending_seq,
        )
        req.queued = now + self._api_pre
        self._requests[request_id] = req
        heapq.heappush(self._pending, (req.queued, self._pending_seq, req))

    def prefilled(self, request_id: RequestId) -> int:
        """Prompt tokens the engine has computed for the request so far, its prefix-cache hits left out (the
        prefill work an abort throws away); 0 for a request it does not know or has not scheduled."""
        req = self._requests.get(request_id)
        if req is None or req.cached_tokens < 0:
            return 0
        return max(0, min(req.num_computed, req.prompt_len) - req.cached_tokens)

    def abort(self, request_id: RequestId) -> bool:
        """Drop a request wherever it is and free its blocks. False if the engine does not know it."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return False
        state = req.state
        if state == WAITING:
            self._waiting.remove(req)
        elif state in (PREFILL, DECODE):
            if state == DECODE:
                computed = self._sync_decode(req, self._decode_clock)
                del self._decoding[request_id]
                self._decode_context -= computed
            else:
                self._prefilling.remove(req)
            del self._running[request_id]
            self._kv.free(req)  # an in-flight step skips it: its state is no longer PREFILL/DECODE
        req.state = ABORTED  # a pending request stays in the heap until popped
        return True

    # ------------------------------------------------------------------------------------------ steps

    def plan_step(self, now: float) -> Step | None:
        """Choose the next batch at ``now`` (allocating its blocks, preempting if needed); None if idle.

        The profile's scheduler policy (``slorouter.sim.scheduler``) decides which phases run and in which
        order; the phases themselves are ``schedule_decodes``, ``schedule_prefills`` and ``admit_waiting``.
        """
        if self._inflight is not None:
            raise RuntimeError("the previous step has not been committed")
        if self._pending:
            self._release_pending(now)
        if not self._running and not self._waiting:
            return None
        disruptions = self._disruptions
        if disruptions is not None:
            resume = disruptions.resume_time(now)
            if resume > now:  # stalled: nothing runs before the pause ends
                self._resume_at = resume
                return None
            self._resume_at = None
        batch = Batch(self._decode_clock, self.profile.max_num_batched_tokens, self.num_preemptions_total)
        self._policy.plan(self, batch, now)
        chunks = batch.chunks
        num_decodes = len(self._decoding) if batch.decodes else 0
        prefill_tokens = sum(n for _, n in chunks) if chunks else 0
        if num_decodes == 0 and prefill_tokens == 0:
            return None
        context = self._decode_context + num_decodes if num_decodes else 0
        # Profile.step_ms, inlined (same terms, same order).
        profile = self.profile
        tokens = num_decodes + prefill_tokens
        duration_ms = (
            max(profile.w_ms, profile.c_lin_ms * tokens)
            + profile.c_attn_ms * batch.pairs
            + profile.c_kv_ms * context
            + profile.c_req_ms * num_decodes
            + profile.c_step_ms
        )
        if self._sigma > 0.0:
            duration_ms *= math.exp(self._gauss(0.0, self._sigma) - self._jitter_shift)
        duration = duration_ms / 1000.0
        if disruptions is not None:
            duration = disruptions.step_duration(now, duration)
        step = Step(
            self._steps_done,
            now,
            duration,
            num_decodes,
            prefill_tokens,
            batch.preempted(self),
            chunks,
            batch.finishing,
            batch.index,
            batch.decodes,
        )
        self._inflight = step
        return step

    # ------------------------------------------------------------- batch phases (for scheduler policies)

    def schedule_decodes(self, batch: Batch, *, spare_decodes: bool = False) -> None:
        """Run every decoding request in this step: give a new block to those that need one (preempting the
        newest running request when none is free; with ``spare_decodes`` the newest prefilling one while
        there is one; under the priority queue the one with the largest (priority, arrival) instead of the
        newest) and take the decodes' tokens out of the budget."""
        batch.decodes = True
        index = batch.index
        block_size = self.block_size
        finishing = batch.finishing
        kv = self._kv
        # This loop runs for every decoding request every block_size steps: _sync_decode and
        # _schedule_decode_event are inlined.
        due = self._due.pop(index, None)
        if due:
            if len(due) > 1:
                due.sort(key=_run_order)
            for req in due:
                if req.state != DECODE or req.next_event != index:  # preempted, or a stale duplicate
                    continue
                req.next_event = -1
                advanced = index - req.dec_step
                req.num_computed = computed = req.dec_computed + advanced
                req.num_output = num_output = req.dec_output + advanced
                req.num_tokens = req.prompt_len + num_output
                blocks = req.blocks
                if computed >= len(blocks) * block_size:  # the token computed now opens a new block
                    kv.cache_full_blocks(req, computed)
                    while kv.num_free_blocks == 0:
                        if spare_decodes and self._prefilling:
                            self._preempt_prefill(self._prefill_victim(), batch)
                        elif self._preempt_newest(batch) is req:
                            break
                    if req.state != DECODE:
                        continue
                    kv.append_block(req)
                if index == req.finish_step:
                    finishing.append(req)
                else:
                    event = req.dec_step + len(blocks) * block_size - req.dec_computed
                    if req.finish_step < event:
                        event = req.finish_step
                    req.next_event = event
                    later = self._due.get(event)
                    if later is None:
                        self._due[event] = [req]
                    else:
                        later.append(req)
        batch.budget -= len(self._decoding)

    def schedule_prefills(self, batch: Batch, *, spare_decodes: bool = False) -> None:
        """Give each running prefill its next chunk, in admission order, while the budget lasts.

        A chunk that needs blocks when none is free preempts the newest running request; with
        ``spare_decodes`` only the newest *prefilling* one, and a prefill that would have to preempt itself
        waits instead (``batch.stalled``, and no later prefill runs). Under the priority queue the victim is
        the one with the largest (priority, arrival) instead of the newest; one already given a chunk in
        this step gives it back.
        """
        if not self._prefilling:
            return
        block_size = self.block_size
        threshold = self.profile.long_prefill_token_threshold
        chunks = batch.chunks
        kv = self._kv
        for req in list(self._prefilling):
            if batch.budget <= 0:
                break
            if req.state != PREFILL:  # preempted while making room for an earlier request
                continue
            computed = req.num_computed
            n = min(req.num_tokens - computed, batch.budget)
            if threshold and n > threshold:
                n = threshold
            needed = -(-(computed + n) // block_size) - len(req.blocks)
            while needed > kv.num_free_blocks:
                if spare_decodes:
                    victim = self._prefill_victim()
                    if victim is req:
                        break
                    self._preempt_prefill(victim, batch)
                elif self._preempt_newest(batch) is req:
                    break
            if req.state != PREFILL:
                continue
            if needed > kv.num_free_blocks:
                batch.stalled = True
                break
            if needed:
                kv.append_blocks(req, needed)
            kv.cache_full_blocks(req, computed + n)
            chunks.append((req, n))
            batch.pairs += n * (computed + n / 2)
            batch.budget -= n

    def admit_waiting(self, batch: Batch, now: float) -> None:
        """Move waiting requests into the batch in queue order (FCFS, or by priority), while budget, seats
        and blocks last (never preempts: the head of the queue waits for space, and the queue behind it
        too)."""
        block_size = self.block_size
        max_seqs = self.profile.max_num_seqs
        threshold = self.profile.long_prefill_token_threshold
        waiting = self._waiting
        chunks = batch.chunks
        kv = self._kv
        budget = batch.budget
        pairs = 0.0
        while waiting and budget > 0 and len(self._running) < max_seqs:
            req = waiting[0]
            hits = kv.lookup_prefix(req, req.num_tokens)
            computed = len(hits) * block_size
            n = min(req.num_tokens - computed, budget)
            if threshold and n > threshold:
                n = threshold
            needed = -(-(computed + n) // block_size) - len(hits)
            if not kv.can_admit(hits, needed):
                break  # it waits for space: the next step's lookup resumes from the hits found now
            waiting.popleft()
            kv.admit(req, hits, needed)
            req.num_computed = computed
            if req.scheduled_time < 0:
                req.scheduled_time = now
                req.cached_tokens = computed
                self.prefix_cache_queries += req.num_tokens
                self.prefix_cache_hits += computed
            kv.cache_full_blocks(req, computed + n)
            req.state = PREFILL
            self._run_seq += 1
            req.run_seq = self._run_seq
            self._running[req.request_id] = req
            self._prefilling.append(req)
            chunks.append((req, n))
            pairs += n * (computed + n / 2)
            budget -= n
        batch.budget = budget
        batch.pairs += pairs

    @property
    def num_decoding(self) -> int:
        return len(self._decoding)

    def commit_step(self, step: Step, now: float | None = None) -> StepOutput:
        """Apply a planned step, finished at ``now`` (default ``step.end``)."""
        if step is not self._inflight:
            raise RuntimeError("commit_step needs the step returned by the last plan_step")
        time = step.end if now is None else now
        self._inflight = None
        self._steps_done = step.index + 1
        decoding = self._decoding
        if step._decodes:
            self._decode_clock = step._decode_index + 1
            self._decode_context += len(decoding)
            # The requests that decoded in this step: those planned, minus any aborted since (abort removes
            # them).
            tokens = list(decoding) if self._report_tokens else []
            generated = len(decoding)
        else:  # the policy paused the decodes for this step
            tokens = []
            generated = 0
        index = self._decode_clock
        first_tokens: list[FirstToken] = []
        finished: list[Finished] = []

        for req in step._finishing:
            if req.state != DECODE:
                continue
            self._decode_context -= self._sync_decode(req, index)
            del decoding[req.request_id]
            finished.append(self._finish(req, time))

        for req, n in step._chunks:
            if req.state != PREFILL:
                continue
            req.num_computed += n
            if req.num_computed < req.num_tokens:
                continue
            self._prefilling.remove(req)
            req.num_output += 1
            req.num_tokens += 1
            generated += 1
            if self._report_tokens:
                tokens.append(req.request_id)
            if req.first_token_time < 0:
                req.first_token_time = time
                self.prompt_tokens_total += req.prompt_len
                first_tokens.append(
                    FirstToken(req.request_id, time, req.arrival, req.prompt_len, req.cached_tokens)
                )
            if req.num_output >= req.max_tokens:
                self._kv.cache_full_blocks(req, req.num_computed)
                finished.append(self._finish(req, time))
            else:
                self._start_decoding(req, index)

        self.generation_tokens_total += generated
        return StepOutput(time, tokens, first_tokens, finished)

    # --------------------------------------------------------------------------------------- internals

    def _release_pending(self, now: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= now:
            req = heapq.heappop(pending)[2]
            if req.state == PENDING:
                req.state = WAITING
                self._waiting.append(req)

    def _preempt_newest(self, batch: Batch) -> _Request:
        """Preempt the newest running request (vLLM's FCFS victim, ``running.pop()``) or, under the
        priority queue, the one with the largest (priority, arrival) (vLLM's ``max(self.running, key=lambda
        r: (r.priority, r.arrival_time))``)."""
        running = self._running
        if self._by_priority:
            victim = max(running.values(), key=_priority_order)
            del running[victim.request_id]
        else:
            victim = running.pop(next(reversed(running)))
        self._preempt(victim, batch)
        return victim

    def _prefill_victim(self) -> _Request:
        """The prefilling request a ``spare_decodes`` phase preempts: the newest, or by priority."""
        prefilling = self._prefilling
        return max(prefilling, key=_priority_order) if self._by_priority else prefilling[-1]

    def _preempt_prefill(self, victim: _Request, batch: Batch) -> None:
        del self._running[victim.request_id]
        self._preempt(victim, batch)

    def _preempt(self, victim: _Request, batch: Batch) -> None:
        """Free a request already taken out of the running set and put it back at the head of the queue
        (under the priority queue: in its place). A chunk it has in ``batch`` is taken back out."""
        if victim.state == DECODE:
            computed = self._sync_decode(victim, batch.index)
            del self._decoding[victim.request_id]
            self._decode_context -= computed
            self._kv.cache_full_blocks(victim, computed)
            finishing = batch.finishing
            if victim in finishing:
                finishing.remove(victim)
        else:
            self._prefilling.remove(victim)
            chunks = batch.chunks
            for i, (req, n) in enumerate(chunks):  # only the priority queue picks an older prefill
                if req is victim:
                    del chunks[i]
                    batch.budget += n
                    batch.pairs -= n * (victim.num_computed + n / 2)
                    break
        self._kv.free(victim)
        victim.num_computed = 0
        victim.num_preemptions += 1
        victim.state = WAITING
        self._waiting.appendleft(victim)
        self.num_preemptions_total += 1

    def _start_decoding(self, req: _Request, index: int) -> None:
        req.state = DECODE
        req.dec_step = index
        req.dec_computed = req.num_computed
        req.dec_output = req.num_output
        req.finish_step = index + req.max_tokens - req.num_output - 1
        self._decoding[req.request_id] = req
        self._decode_context += req.num_computed
        self._schedule_decode_event(req)

    def _schedule_decode_event(self, req: _Request) -> None:
        """Register the next step at which the request needs a new block or finishes."""
        block_step = req.dec_step + len(req.blocks) * self.block_size - req.dec_computed
        step = min(block_step, req.finish_step)
        req.next_event = step
        due = self._due.get(step)
        if due is None:
            self._due[step] = [req]
        else:
            due.append(req)

    @staticmethod
    def _sync_decode(req: _Request, index: int) -> int:
        """Update a decoding request's counters to just before step ``index``; returns its computed tokens."""
        advanced = index - req.dec_step
        req.num_computed = computed = req.dec_computed + advanced
        req.num_output = req.dec_output + advanced
        req.num_tokens = req.prompt_len + req.num_output
        return computed

    def _finish(self, req: _Request, time: float) -> Finished:
        del self._running[req.request_id]
        del self._requests[req.request_id]
        self._kv.free(req)
        req.state = FINISHED
        self.num_finished_total += 1
        done = time + self._api_post + self._api_per_token * req.num_output
        return Finished(
            request_id=req.request_id,
            prompt_tokens=req.prompt_len,
            cached_tokens=req.cached_tokens,
            output_tokens=req.num_output,
            arrival_time=req.arrival,
            queued_time=req.queued,
            scheduled_time=req.scheduled_time,
            first_token_time=req.first_token_time,
            finish_time=time,
            done_time=done,
            num_preemptions=req.num_preemptions,
        )


_run_order = operator.attrgetter("run_seq")
_priority_order = operator.attrgetter("priority", "arrival", "order")
