"""One discrete-event run of a ``ClusterSimulator``: the event queue and one handler per kind of event.

Events are ``(time, sequence, kind, argument)`` in a heap; at equal times they run in the order they were
pushed. Each handler does what the network, the pods or the router's timers would do at that instant
(``cluster.py``'s docstring says what is modelled); after every event, requests that flow control released
are routed and its next wake-up is scheduled.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from slorouter.api.replies import TEXT
from slorouter.bench.pool_regret import cached_prompt_tokens
from slorouter.bench.records import (
    CANCELLED,
    OK,
    PICK_REASONS,
    REJECTED,
    SHED,
    UNFINISHED,
    RunRecords,
    empty_column,
)
from slorouter.bench.workloads import BenchRequest
from slorouter.bench.workloads.request import objective_of
from slorouter.director import NOT_QUEUED, Admission
from slorouter.flowcontrol.config import FAIRNESS_ID_HEADER as FAIRNESS_HEADER
from slorouter.flowcontrol.controller import Ticket
from slorouter.kvevents.wire import KVEventBatch
from slorouter.pool.config import LOWER_FIRST
from slorouter.pool.kv_trust import TrustReason
from slorouter.scheduling.plugin import Termination
from slorouter.scheduling.types import InferenceRequest, SchedulingError
from slorouter.serving.engine_priority import engine_value
from slorouter.serving.exchange import Exchange
from slorouter.serving.slo_actions import Action
from slorouter.sim.engine import Finished, FirstToken, RequestId, RequestRejected, Step
from slorouter.sim.text import output_text
from slorouter.tokenizer import BYTES_PER_TOKEN, encode_bytes

if TYPE_CHECKING:
    from slorouter.bench.cluster import ClusterSimulator, RouterStack

# Event kinds (indices into ``SimulationRun._handlers``).
(
    _ARRIVAL,
    _WAKE,
    _STEP_END,
    _FIRST_TOKEN,
    _DONE,
    _SCRAPE,
    _TRAIN,
    _KV_EVENTS,
    _PUBLISH,
    _PUBLISH_CHANGE,
    _DELIVER,
    _FLOW,
    _TUNE,
    _SWITCH,
    _GUARD,
    _HEDGE,
    _DEADLINE,
) = range(17)


class SimulationRun:
    """The state of one run and its event handlers."""

    def __init__(
        self,
        simulator: ClusterSimulator,
        requests: Sequence[BenchRequest],
        progress: Callable[[float], None] | None,
        switches: Sequence[tuple[float, str]] = (),
    ) -> None:
        self.sim = simulator
        self.switches = switches
        self.requests = requests
        self.progress = progress
        self.started = time.perf_counter()
        settings = self.settings = simulator.settings
        n = len(requests)
        self.rec = rec = RunRecords(
            arrival=np.array([r.arrival for r in requests], dtype=np.float64),
            status=np.full(n, UNFINISHED, dtype=np.int32),
            pod=np.full(n, -1, dtype=np.int32),
            ttft_s=empty_column(n),
            e2e_s=empty_column(n),
            prompt_tokens=np.zeros(n, dtype=np.int64),
            cached_tokens=np.zeros(n, dtype=np.int64),
            output_tokens=np.zeros(n, dtype=np.int64),
            slo_ttft_ms=np.array([_or_nan(r.slo_ttft_ms) for r in requests], dtype=np.float64),
            slo_tpot_ms=np.array([_or_nan(r.slo_tpot_ms) for r in requests], dtype=np.float64),
            predicted=np.zeros(n, dtype=bool),
            predicted_ttft_ms=empty_column(n),
            point_ttft_ms=empty_column(n),
            predicted_tpot_ms=empty_column(n),
            point_tpot_ms=empty_column(n),
            pod_profiles=[p.name for p in simulator.profiles],
            picker=simulator.assign_pickers(n),
            queued_s=empty_column(n),
            achieved_prefix_tokens=np.full(n, -1, dtype=np.int64),
            reachable_prefix_tokens=np.full(n, -1, dtype=np.int64),
            ttft_regret_ms=empty_column(n),
            true_achieved_prefix_tokens=np.full(n, -1, dtype=np.int64),
            true_reachable_prefix_tokens=np.full(n, -1, dtype=np.int64),
            pick_reason=np.full(n, -1, dtype=np.int8),
        )
        if n and np.any(np.diff(rec.arrival) < 0):
            raise ValueError("requests must be sorted by arrival time")
        self.end = (float(rec.arrival[-1]) if n else 0.0) + settings.drain_s
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = itertools.count()
        self.engines = simulator.engines
        self.busy: list[Step | None] = [None] * len(self.engines)
        self.wake_at = [math.inf] * len(self.engines)
        self.exchanges: dict[int, Exchange] = {}
        # Engine request ids: request i is ``i`` on its pick's engine and ``n + i`` on its hedged copy's.
        self.n = n
        self.thrown_prefill = 0  # prompt tokens the engines computed for copies that lost, then aborted
        self.net = settings.network_s
        self.arrivals_left = n
        self.steps = self.events = self.trainings = 0
        self.recorders = simulator.kv_recorders
        self.kv_event_drop = settings.kv_event_drop
        self.kv_gap = [False] * len(self.engines)  # a batch of the pod was lost since its last one
        self.gap_clears = None if settings.kv_trust is None else TrustReason.UNRECOVERED_GAP
        self.kv_indexes = [stack.kv_index for stack in simulator.pickers if stack.kv_index is not None]
        self.pickers = simulator.pickers
        # Hedging watches for stalled pods: every step is a token on the pod's streams.
        self.watch_progress = any(stack.director.tracker.watches_stalls for stack in self.pickers)
        self.board = simulator.board
        self.predictors = list(
            {id(s.predictor): s.predictor for s in self.pickers if s.predictor is not None}.values()
        )
        self.publish_every = settings.shared_inflight_interval_s
        self.on_change = self.board is not None and settings.shared_inflight_publishing == "on-change"
        # An on-change publication is due (after the current event), per picker.
        self.publishing = [False] * len(self.pickers)
        self.next_progress = 0.0
        # Flow control: requests that left a queue (the controller's callback), routed after each event.
        self.released: list[tuple[int, InferenceRequest, Ticket]] = []
        self.flow_timer = [math.inf] * len(self.pickers)
        self._handlers: list[Callable[[float, Any], None]] = [
            self._arrival,
            self._wake,
            self._step_end,
            self._first_token,
            self._done,
            self._scrape,
            self._train,
            self._kv_events,
            self._publish,
            self._publish_change,
            self._deliver,
            self._flow,
            self._tune,
            self._switch,
            self._guard,
            self._hedge,
            self._deadline,
        ]

    def push(self, at: float, kind: int, arg: Any) -> None:
        heapq.heappush(self.heap, (at, next(self.seq), kind, arg))

    def execute(self) -> RunRecords:
        rec, settings, pickers = self.rec, self.settings, self.pickers
        for i in range(len(self.requests)):
            self.push(float(rec.arrival[i]), _ARRIVAL, i)
        self.push(settings.scrape_interval_s, _SCRAPE, None)
        if self.predictors and settings.training:
            self.push(settings.train_poll_s, _TRAIN, None)
        tuner = self.sim.tuner
        if tuner is not None:
            self.push(tuner.settings.interval_s, _TUNE, None)
        for at, candidate in self.switches:
            self.push(at, _SWITCH, candidate)
        if self.board is not None:  # each picker on its own phase, as unsynchronised processes would be
            for k in range(len(pickers)):
                self.push(self.publish_every * (k + 1) / len(pickers), _PUBLISH, k)
        heap, pop, handlers, end = self.heap, heapq.heappop, self._handlers, self.end
        set_clock = self.sim.clock.set
        while heap:
            now, _, kind, arg = pop(heap)
            if now > end:
                break
            self.events += 1
            set_clock(now)
            handlers[kind](now, arg)
            self._after_event(now)
        for exchange in self.exchanges.values():  # still running at the end: release their in-flight load
            exchange.abandoned(Termination.CANCELLED, "the simulation ended before the request finished")
        for stack in pickers:  # and the others' published load folded into each picker's counts
            if stack.shared is not None:
                stack.shared.detach()
        clock = self.sim.clock
        if self.progress is not None:
            self.progress(clock.now())
        rec.virtual_s = clock.now()
        rec.wall_s = time.perf_counter() - self.started
        rec.steps, rec.events, rec.trainings = self.steps, self.events, self.trainings
        rec.facts = self.sim.facts()
        if "slo_actions" in rec.facts:
            rec.facts["slo_actions"]["thrown_prefill_tokens"] = self.thrown_prefill
        return rec

    # --- the pods --------------------------------------------------------------------------------------
    def _kick(self, pod: int, now: float) -> None:
        """Start the pod's next step, or wake it when its next request clears the API overhead."""
        if self.busy[pod] is not None:
            return
        engine = self.engines[pod]
        step = engine.plan_step(now)
        if step is not None:
            self.busy[pod] = step
            self.push(step.end, _STEP_END, pod)
            return
        ready = engine.next_ready_time()
        if ready is not None and ready < self.wake_at[pod]:
            self.wake_at[pod] = ready
            self.push(ready, _WAKE, pod)

    def _step_end(self, now: float, pod: int) -> None:
        step = self.busy[pod]
        assert step is not None
        self.busy[pod] = None
        out = self.engines[pod].commit_step(step, now)
        self.steps += 1
        net = self.net
        if self.watch_progress:
            # The engine ran a step: its decoding streams got a token each, as a front-end sees them. Every
            # step counts, not only those with decodes: the router counts a request as decoding until its
            # end arrives, which the simulated API overhead puts up to a few hundred ms after its last step.
            address = self.sim.addresses[pod]
            for stack in self.pickers:
                stack.director.tracker.progressed(address, now + net)
        for first in out.first_tokens:
            self.push(first.time + net, _FIRST_TOKEN, first)
        for done in out.finished:
            self.push(done.done_time + net, _DONE, done)
        if self.recorders:
            kv_events = self.recorders[pod].drain()
            if kv_events:
                if self.kv_event_drop and self.sim.kv_drops.random() < self.kv_event_drop:
                    self.kv_gap[pod] = True  # the next batch shows it
                else:
                    batch = KVEventBatch(now, kv_events)
                    event = (pod, batch, self.kv_gap[pod])
                    self.kv_gap[pod] = False
                    self.push(now + self.settings.kv_event_delay_s, _KV_EVENTS, event)
        self._kick(pod, now)

    def _wake(self, now: float, pod: int) -> None:
        if self.wake_at[pod] == now:
            self.wake_at[pod] = math.inf
            self._kick(pod, now)

    # --- the responses ---------------------------------------------------------------------------------
    def _first_token(self, now: float, first_token: FirstToken) -> None:
        engine_id = _engine_id(first_token.request_id)
        i = engine_id % self.n
        exchange = self.exchanges.get(i)
        if exchange is None:
            return
        if exchange.copy is not None:  # a hedged request: the first token decides the race
            self._race_won(i, exchange, engine_id, now)
        elif self._serving_id(i, exchange) != engine_id:  # the copy that lost, in flight when it ended
            return
        elif exchange.lifecycle is not None:
            exchange.raced(exchange.lifecycle)  # a hedge whose other copy failed: counted
        exchange.started(200, True, bytes_follow=False)
        exchange.tokens(1)
        rec = self.rec
        rec.ttft_s[i] = now - rec.arrival[i]
        if self.on_change:
            self._changed(int(rec.picker[i]), now)

    def _done(self, now: float, finished: Finished) -> None:
        engine_id = _engine_id(finished.request_id)
        i = engine_id % self.n
        exchange = self.exchanges.get(i)
        if exchange is None or self._serving_id(i, exchange) != engine_id:
            return
        del self.exchanges[i]
        assert exchange.lifecycle is not None
        wanted = exchange.lifecycle.reply_chars_wanted
        if wanted > 0:  # the engine's reply is output_text(0, n): ASCII, BYTES_PER_TOKEN a token
            tokens = min(finished.output_tokens, -(-wanted // BYTES_PER_TOKEN))
            exchange.reply_text(output_text(0, tokens))
        exchange.answered(
            usage={"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.output_tokens}
        )
        rec = self.rec
        rec.status[i] = OK
        rec.e2e_s[i] = now - rec.arrival[i]
        rec.output_tokens[i] = finished.output_tokens
        rec.cached_tokens[i] = finished.cached_tokens
        if self.on_change:
            self._changed(int(rec.picker[i]), now)

    # --- the requests ----------------------------------------------------------------------------------
    def _arrival(self, now: float, i: int) -> None:
        self.arrivals_left -= 1
        rec = self.rec
        k = int(rec.picker[i])
        inference = self._inference(i, self.requests[i], now)
        director = self.pickers[k].director
        if director.flow_control is None:
            self._route(k, i, inference, NOT_QUEUED, now)
        else:
            ticket = director.admit(inference, _releaser(self.released, i, inference))
            if ticket.rejection is not None:
                rec.status[i] = SHED
        if self.progress is not None and now >= self.next_progress:
            self.progress(now)
            self.next_progress = now + 1.0

    def _inference(self, i: int, request: BenchRequest, now: float) -> InferenceRequest:
        prompt_tokens = len(encode_bytes(request.prompt)) // BYTES_PER_TOKEN
        self.rec.prompt_tokens[i] = prompt_tokens
        return InferenceRequest(
            request_id=str(i),
            model=self.settings.model,
            prompt_text=request.prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=request.max_tokens,
            stream=True,
            priority=request.priority,
            objective=objective_of(request.priority),
            slo_ttft_ms=request.slo_ttft_ms,
            slo_tpot_ms=request.slo_tpot_ms,
            received_at=now,
            history_form=TEXT,  # completions: the next turn's prompt is this prompt followed by the reply
            headers={FAIRNESS_HEADER: request.tenant} if request.tenant else {},
        )

    def _route(self, k: int, i: int, inference: InferenceRequest, admission: Admission, now: float) -> None:
        self._send(self.pickers[k], i, inference, admission, now)
        if self.on_change:
            self._changed(k, now)

    def _regret(self, i: int, exchange: Exchange, prompt: bytes, pod: int) -> None:
        """Request ``i``'s routing regret: the router's (the exchange's, from its pick record) and the pool's
        (the engines' caches now, before the request is added)."""
        rec = self.rec
        regret, lifecycle = exchange.regret, exchange.lifecycle
        if regret is not None and lifecycle is not None and lifecycle.result.record is not None:
            record = lifecycle.result.record
            rec.achieved_prefix_tokens[i] = regret.achieved_prefix_tokens
            rec.reachable_prefix_tokens[i] = regret.reachable_prefix_tokens
            rec.pick_reason[i] = PICK_REASONS.index(record.reason)
            if regret.ttft_regret_ms is not None:
                rec.ttft_regret_ms[i] = regret.ttft_regret_ms
        held = cached_prompt_tokens(self.engines, prompt)
        rec.true_achieved_prefix_tokens[i] = held[pod]
        rec.true_reachable_prefix_tokens[i] = max(held)

    def _send(
        self, stack: RouterStack, i: int, inference: InferenceRequest, admission: Admission, now: float
    ) -> None:
        """Schedule (on the load of ``now``: after the queue, when there is one), dispatch, and send."""
        rec = self.rec
        rec.queued_s[i] = admission.queued_s
        exchange = Exchange.of(stack.front, inference)
        exchange.admission = admission
        try:
            lifecycle = exchange.pick_now()
        except SchedulingError as exc:
            rec.status[i] = exc.status
            return
        pod = self.sim.pod_of[lifecycle.target.address]
        rec.pod[i] = pod
        prediction = lifecycle.prediction
        if prediction is not None and stack.predictor is not None:
            ttft, tpot = prediction.ttft_ms, prediction.tpot_ms
            rec.predicted[i] = True
            rec.predicted_ttft_ms[i] = ttft
            # The point prediction is the model's: without the live-coverage factor of the served quantile.
            point_factor = stack.predictor.predictor.point_factor
            rec.point_ttft_ms[i] = prediction.model_ttft_ms * point_factor("ttft")
            model_tpot = prediction.model_tpot_ms  # None: no TPOT model (yet: the producer's 0)
            if model_tpot is not None:
                rec.predicted_tpot_ms[i] = tpot
                rec.point_tpot_ms[i] = model_tpot * point_factor("tpot")
        prompt = encode_bytes(inference.prompt_text)  # what the HTTP simulator's tokenizer gives the engine
        self._regret(i, exchange, prompt, pod)
        try:
            self.engines[pod].add_request(
                i, prompt, inference.max_tokens, now + self.net, self._engine_priority(inference)
            )
        except RequestRejected as exc:
            exchange.failed(Termination.UPSTREAM_ERROR, str(exc), "rejected")
            rec.status[i] = REJECTED
            return
        self.exchanges[i] = exchange
        self._kick(pod, now)
        plan = exchange.plan
        if plan is not None:
            if plan.action is Action.CANCEL:
                self.push(max(now, plan.deadline_at), _DEADLINE, i)
            else:
                due = exchange.hedge_at()
                if due is not None:
                    self.push(max(now, due), _HEDGE, i)

    def _engine_priority(self, inference: InferenceRequest) -> int:
        """What the pod's engine is told: the request's priority in vLLM's form under a ``+prio`` policy
        (the simulated pods are vLLM), else nothing (0)."""
        return engine_value(inference.priority, LOWER_FIRST) if self.sim.engine_priority else 0

    # --- deadlines and hedges --------------------------------------------------------------------------
    def _hedge(self, now: float, i: int) -> None:
        """The hedge of request ``i`` is due: without a first token yet, a copy goes to the best other pod (or
        is held back until it would answer first)."""
        exchange = self.exchanges.get(i)
        if exchange is None or exchange.hedged or exchange.lifecycle is None:
            return
        if exchange.lifecycle.response.first_token_at is not None:
            return
        copy = exchange.hedge_now()
        if copy is None:
            due = exchange.hedge_at()
            if due is not None:
                self.push(max(now, due), _HEDGE, i)
            return
        pod = self.sim.pod_of[copy.target.address]
        inference = copy.request
        try:
            self.engines[pod].add_request(
                self.n + i,
                encode_bytes(inference.prompt_text),
                inference.max_tokens,
                now + self.net,
                self._engine_priority(inference),
            )
        except RequestRejected as exc:
            exchange.hedge_failed(copy, Termination.UPSTREAM_ERROR, str(exc), "rejected")
            return
        self._kick(pod, now)

    def _serving_id(self, i: int, exchange: Exchange) -> int:
        """The engine id whose tokens request ``i``'s client gets: its copy's once the copy won the race."""
        copy = exchange.hedge_copy
        return self.n + i if copy is not None and exchange.lifecycle is copy else i

    def _race_won(self, i: int, exchange: Exchange, engine_id: int, now: float) -> None:
        """The first token of request ``i`` or of its copy (``engine_id``): that one goes on, the other is
        aborted in its engine (its slot and KV blocks freed)."""
        copy, primary = exchange.copy, exchange.lifecycle
        assert copy is not None and primary is not None
        copy_won = engine_id >= self.n
        winner, loser = (copy, primary) if copy_won else (primary, copy)
        exchange.raced(winner)
        loser_pod = self.sim.pod_of[loser.target.address]
        engine = self.engines[loser_pod]
        loser_id = i if copy_won else self.n + i
        self.thrown_prefill += engine.prefilled(loser_id)
        engine.abort(loser_id)
        self._kick(loser_pod, now)
        self.rec.pod[i] = self.sim.pod_of[winner.target.address]

    def _deadline(self, now: float, i: int) -> None:
        """Request ``i``'s TTFT deadline (a ``cancel`` plan): without a first token, it is cancelled."""
        exchange = self.exchanges.get(i)
        if exchange is None or exchange.lifecycle is None:
            return
        if exchange.lifecycle.response.first_token_at is not None:
            return
        del self.exchanges[i]
        pod = int(self.rec.pod[i])
        exchange.refuse(504, exchange.deadline_passed())
        self.engines[pod].abort(i)
        self._kick(pod, now)
        self.rec.status[i] = CANCELLED

    # --- flow control ----------------------------------------------------------------------------------
    def _flow(self, now: float, k: int) -> None:
        self.flow_timer[k] = math.inf
        controller = self.pickers[k].director.flow_control
        assert controller is not None
        controller.service()

    def _after_event(self, now: float) -> None:
        released = self.released
        while released:
            i, inference, ticket = released.pop(0)
            k = int(self.rec.picker[i])
            try:
                admission = self.pickers[k].director.admitted(ticket)
            except SchedulingError as exc:
                self.rec.status[i] = exc.status
                continue
            self._route(k, i, inference, admission, now)
        for k, stack in enumerate(self.pickers):
            controller = stack.director.flow_control
            if controller is None or not len(controller):
                continue
            wake = controller.next_wakeup()
            if wake is not None and wake < self.flow_timer[k]:
                self.flow_timer[k] = wake
                self.push(wake, _FLOW, k)

    # --- the router's timers ---------------------------------------------------------------------------
    def _scrape(self, now: float, _: None) -> None:
        self.sim.scrape_all(now)
        pickers = self.pickers
        for stack in pickers:  # new engine signals: maybe room
            if stack.director.flow_control is not None:
                stack.director.flow_control.service()
        # After the last arrival only requests still held by flow control read them.
        if self.arrivals_left or any(
            stack.director.flow_control is not None and len(stack.director.flow_control) for stack in pickers
        ):
            self.push(now + self.settings.scrape_interval_s, _SCRAPE, None)

    def _kv_events(self, now: float, event: tuple[int, KVEventBatch, bool]) -> None:
        pod, batch, gap = event
        address = self.sim.addresses[pod]
        for kv_index in self.kv_indexes:  # every picker subscribes to every pod's events
            if gap:
                kv_index.clear_pod(address, self.gap_clears)
            kv_index.apply(address, batch)
            kv_index.pod_trust(address).batch(now, lag_s=now - batch.ts, events=len(batch.events))

    def _train(self, now: float, _: None) -> None:
        for predictor in self.predictors:
            self.trainings += len(predictor.maybe_train())
        if self.arrivals_left:
            self.push(now + self.settings.train_poll_s, _TRAIN, None)

    def _tune(self, now: float, _: None) -> None:
        tuner = self.sim.tuner
        assert tuner is not None
        if not self.arrivals_left:  # nothing left to route
            return
        result = self.sim.tune(now)
        self.sim.tuning_log.append(
            {
                "at": now,
                "active": result.active,
                "requests": result.requests,
                "twin_error": None if result.twin_error == math.inf else round(result.twin_error, 4),
                "errors": {k: round(v, 4) for k, v in result.errors.items()},
                "observed_ttft_p90_ms": None if result.observed is None else result.observed.ttft_p90_ms,
                "twin_ttft_p90_ms": {c: f.ttft_p90_ms for c, f in result.replayed.items()},
                "best": result.best,
                "predicted_gain": round(result.predicted_gain, 4),
                "switch_to": result.switch_to,
                "reason": result.reason,
            }
        )
        self.push(now + tuner.settings.interval_s, _TUNE, None)
        if result.switch_to is not None and self.sim.guard is not None and self.sim.guard.watch is not None:
            self.push(now + self.sim.guard.period_s, _GUARD, None)

    def _guard(self, now: float, _: None) -> None:
        guard = self.sim.guard
        assert guard is not None
        watch = guard.watch
        back = self.sim.guard_check(now)
        if back is not None and watch is not None:
            reason = f"guard: TTFT p90 above {guard.ratio}x the {guard.period_s:g} s before the switch"
            self.sim.tuning_log.append(
                {
                    "at": now,
                    "active": back,
                    "reverted_from_switch_at": watch.at,
                    "switch_to": back,
                    "reason": reason,
                }
            )
        elif guard.watch is not None and self.arrivals_left:
            self.push(now + guard.period_s, _GUARD, None)

    def _switch(self, now: float, candidate: str) -> None:
        self.sim.activate(candidate)

    # --- pickers sharing their in-flight load ----------------------------------------------------------
    def _changed(self, k: int, now: float) -> None:
        if not self.publishing[k]:
            self.publishing[k] = True
            self.push(now, _PUBLISH_CHANGE, k)

    def _publish(self, now: float, k: int) -> None:
        shared = self.pickers[k].shared
        assert shared is not None
        self.push(now + self.settings.shared_inflight_delay_s, _DELIVER, shared.publication())
        if self.arrivals_left:
            self.push(now + self.publish_every, _PUBLISH, k)

    def _publish_change(self, now: float, k: int) -> None:
        self.publishing[k] = False
        shared = self.pickers[k].shared
        assert shared is not None
        self.push(now + self.settings.shared_inflight_delay_s, _DELIVER, shared.publication())

    def _deliver(self, now: float, publication: Any) -> None:
        board = self.board
        assert board is not None
        if board.receive(publication):
            for stack in self.pickers:
                if stack.shared is not None and stack.shared.picker != publication.picker:
                    stack.shared.refresh(board)


def _releaser(
    released: list[tuple[int, InferenceRequest, Ticket]], i: int, inference: InferenceRequest
) -> Callable[[Ticket], None]:
    """Flow control's callback for request ``i``: noted, and routed once the current event is done."""

    def on_outcome(ticket: Ticket) -> None:
        released.append((i, inference, ticket))

    return on_outcome


def _engine_id(request_id: RequestId) -> int:
    """The engines here know each request by its index in the run (plus the run's size for a hedged copy)."""
    assert isinstance(request_id, int)
    return request_id


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)
