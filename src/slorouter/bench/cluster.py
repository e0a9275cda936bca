"""A discrete-event simulation of a router in front of a pool of simulated vLLM pods, in virtual time.

Nothing here re-implements routing: each request goes through the real ``Director`` with the configured
plugins (and, for predicted-latency policies, the real ``EmbeddedPredictor``, trained online in virtual
time), and each pod is the real step-level ``Engine`` the HTTP simulator runs. What the event loop adds is
what the network and the clock would do:

- **Arrivals** at their workload times. The router schedules at once (its own CPU time is not modelled),
  dispatches, and the request reaches the pod ``network_s`` later (then the engine's API overhead).
- **Pods** run their engine step by step: a step planned at t ends at t + its duration; an idle pod wakes
  when its next request clears the API overhead.
- **Responses**: the first token and the end of each request reach the router ``network_s`` after the
  engine produced them; the lifecycle hooks (in-flight accounting, training samples, corrections) run then,
  as in the gateway with streaming responses. Intermediate tokens are not delivered one by one: no plugin
  needs them, and a pod's decode batch would cost an event per token.
- **Metrics scraping** of every pod every ``scrape_interval_s`` (one phase for all pods), so the scraped
  signals are as stale as in production; router-local in-flight counts are always fresh.
- **KV events** (policies with the precise prefix plugins): each engine's prefix-cache changes of a step are
  one event batch, applied to the router's ``KVBlockIndex`` ``kv_event_delay_s`` after the step ended (the
  publisher → subscriber path of the gateway, without the encoding).
- **Training**: every ``train_poll_s`` the embedded predictor trains what is due on its own cadence
  (``retrain_interval_s``), synchronously, so a run is deterministic; the model is used from the next
  request on (a real training takes ~0.1–3 s of wall time, small next to the 5 s cadence).
- **Several pickers** (``pickers`` > 1): that many independent router stacks (Director, plugins, embedded
  predictor, in-flight tracker, prefix index) over the same pods, as picker replicas behind a gateway. Each
  request goes to one picker, drawn per request (``picker_assignment``: ``random``, seeded, or
  ``round-robin`` in arrival order), as Envoy spreads ext_proc streams (one per request) over the picker
  endpoints. Every picker scrapes the same pods at the same instants (one snapshot per pod, given to all),
  and with KV events every picker's index gets every batch; in-flight counts, predictor and approximate
  prefix index are each picker's own. With ``shared_inflight`` each picker publishes its own in-flight
  counts (``shared_inflight_publishing``: right after each change, plus a heartbeat every
  ``shared_inflight_interval_s``; or only every interval), received by the others
  ``shared_inflight_delay_s`` later (``slorouter.pool.shared_inflight``), so the counts its plugins read
  are its own (fresh) plus the others' latest. With ``shared_predictor`` the pickers share the first
  one's predictor (one trainer fed by every picker's samples, as worker processes sharing the training
  and prediction sidecars would).

Deterministic for a given seed: engines, router and workload draw from seeded generators, events at equal
times run in insertion order, and XGBoost trains with one thread.
"""

from __future__ import annotations

import heapq
import itertools
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slorouter.api.replies import TEXT
from slorouter.bench.workloads import BenchRequest
from slorouter.clock import ManualClock
from slorouter.director import NOT_QUEUED, Admission, Director
from slorouter.flowcontrol.config import FAIRNESS_ID_HEADER as FAIRNESS_HEADER
from slorouter.flowcontrol.config import FlowControlConfig
from slorouter.flowcontrol.controller import Ticket
from slorouter.kvevents.wire import KVEventBatch
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.shared_inflight import SharedInFlightBoard, SharedInFlightView
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.predictor.embedded import EmbeddedPredictor
from slorouter.predictor.trainer import TrainerConfig
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext, Termination
from slorouter.scheduling.types import InferenceRequest, SchedulingError
from slorouter.serving.exchange import Exchange, FrontEnd
from slorouter.sim.engine import Engine, Finished, FirstToken, RequestId, RequestRejected, Step
from slorouter.sim.gauges import GaugeReporter
from slorouter.sim.kv_events import KVEventRecorder
from slorouter.sim.profiles import Profile
from slorouter.sim.text import output_text
from slorouter.tokenizer import BYTES_PER_TOKEN, encode_bytes

# Request outcomes (``RunRecords.status``): HTTP-like codes, plus UNFINISHED for requests still running
# when the simulation stopped.
OK = 200
REJECTED = 400
SHED = 429
NO_ENDPOINT = 503
UNFINISHED = -1

# Event kinds; at equal times events run in the order they were pushed.
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
) = range(12)

PICKER_ASSIGNMENTS = ("random", "round-robin")
SHARED_INFLIGHT_PUBLISHING = ("on-change", "periodic")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    scrape_interval_s: float = 0.05
    network_s: float = 0.0005  # one way, router ↔ pod
    train_poll_s: float = 1.0
    retrain_interval_s: float = 5.0
    min_samples: int = 200
    drain_s: float = 300.0  # after the last arrival, how long in-flight requests may take to finish
    jitter_sigma: float | None = None  # engine step-time jitter; None: the engine's default
    model: str = "sim-model"
    kv_event_delay_s: float = 0.005  # step end → its KV events in the router's index (with kv_events)
    pickers: int = 1  # independent router stacks over the same pods
    picker_assignment: str = "random"  # how requests are spread over the pickers: PICKER_ASSIGNMENTS
    shared_inflight: bool = False  # pickers publish their in-flight counts to each other
    # "on-change": a picker publishes right after its counts change (changes at one instant coalesced) and
    # heartbeats every interval; "periodic": it publishes every interval only.
    shared_inflight_publishing: str = "on-change"
    shared_inflight_interval_s: float = 0.05  # heartbeat (on-change) or publication (periodic) interval
    shared_inflight_delay_s: float = 0.002  # a publication reaches the other pickers this much later
    shared_inflight_ttl_s: float = 0.5  # a picker's slot not refreshed for this long is dropped
    shared_predictor: bool = False  # pickers use one predictor, trained on all their samples

    def __post_init__(self) -> None:
        if self.scrape_interval_s <= 0 or self.train_poll_s <= 0:
            raise ValueError("scrape_interval_s and train_poll_s must be > 0")
        if self.network_s < 0 or self.drain_s < 0 or self.retrain_interval_s < 0 or self.kv_event_delay_s < 0:
            raise ValueError("network_s, drain_s, retrain_interval_s and kv_event_delay_s must be >= 0")
        if self.pickers < 1:
            raise ValueError(f"pickers must be >= 1 (got {self.pickers})")
        if self.picker_assignment not in PICKER_ASSIGNMENTS:
            raise ValueError(
                f"picker_assignment must be one of {', '.join(PICKER_ASSIGNMENTS)} "
                f"(got {self.picker_assignment!r})"
            )
        if self.shared_inflight_publishing not in SHARED_INFLIGHT_PUBLISHING:
            raise ValueError(
                f"shared_inflight_publishing must be one of {', '.join(SHARED_INFLIGHT_PUBLISHING)} "
                f"(got {self.shared_inflight_publishing!r})"
            )
        if self.shared_inflight_interval_s <= 0 or self.shared_inflight_delay_s < 0:
            raise ValueError("shared_inflight_interval_s must be > 0 and shared_inflight_delay_s >= 0")
        if not self.shared_inflight_ttl_s > self.shared_inflight_interval_s + self.shared_inflight_delay_s:
            raise ValueError(
                "shared_inflight_ttl_s must exceed shared_inflight_interval_s + shared_inflight_delay_s "
                "(else live pickers' slots expire between publications)"
            )


@dataclass(slots=True)
class RunRecords:
    """Per-request outcomes of one run (arrays aligned with the workload's request list), and run facts."""

    arrival: np.ndarray
    status: np.ndarray  # OK, REJECTED, SHED, NO_ENDPOINT or UNFINISHED
    pod: np.ndarray  # index of the pod that served it, -1 if none
    ttft_s: np.ndarray  # first token at the router − arrival; NaN if none
    e2e_s: np.ndarray  # end at the router − arrival; NaN if unfinished
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    output_tokens: np.ndarray
    slo_ttft_ms: np.ndarray  # NaN: no target
    slo_tpot_ms: np.ndarray
    predicted: np.ndarray  # routed with predictions (bool)
    predicted_ttft_ms: np.ndarray  # served (p90, corrected) TTFT prediction for the chosen pod; NaN if none
    point_ttft_ms: np.ndarray  # the point (median-like) prediction behind it
    predicted_tpot_ms: np.ndarray
    point_tpot_ms: np.ndarray
    pod_profiles: list[str]
    # Index of the picker that routed each request (all 0 with one picker; empty if not recorded).
    picker: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    # Seconds each request waited in flow control before its pick (0 without it; NaN if never picked).
    queued_s: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    virtual_s: float = 0.0
    wall_s: float = 0.0
    steps: int = 0
    events: int = 0
    trainings: int = 0
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def tpot_ms(self) -> np.ndarray:
        """(E2E − TTFT) / (output tokens − 1), NaN for single-token or unfinished requests."""
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = (self.e2e_s - self.ttft_s) * 1000.0 / (self.output_tokens - 1)
        return np.where(self.output_tokens > 1, tpot, np.nan)


def _empty(n: int, value: float = math.nan) -> np.ndarray:
    return np.full(n, value, dtype=np.float64)


@dataclass(slots=True)
class RouterStack:
    """One picker: its pool view (shared scraped signals, its own in-flight counts), plugins, director."""

    pool: PoolState
    tracker: InFlightTracker
    director: Director
    predictor: EmbeddedPredictor | None
    kv_index: KVBlockIndex | None
    shared: SharedInFlightView | None = None
    front: FrontEnd = field(init=False)

    def __post_init__(self) -> None:
        self.front = FrontEnd(self.director, "bench")


class ClusterSimulator:
    """One router (Director + plugins [+ embedded predictor]) per picker and one engine per pod, in virtual
    time. ``pool``, ``tracker``, ``director``, ``predictor`` and ``kv_index`` are the first picker's;
    ``pickers`` lists every picker's stack."""

    def __init__(
        self,
        profiles: Sequence[Profile],
        scheduler_config: Mapping[str, Any] | None,
        *,
        use_predictor: bool,
        settings: ClusterSettings | None = None,
        seed: int = 0,
        trainer_config: TrainerConfig | None = None,
        kv_events: bool = False,
        flow_control: FlowControlConfig | None = None,
    ) -> None:
        if not profiles:
            raise ValueError("the pool needs at least one pod")
        self.settings = settings or ClusterSettings()
        self.profiles = list(profiles)
        self.clock = ManualClock(0.0)
        self.engines = [
            Engine(
                profile,
                seed=seed * 7919 + i,
                jitter_sigma=self.settings.jitter_sigma,
                report_tokens=False,  # responses are delivered as first token and end only
            )
            for i, profile in enumerate(self.profiles)
        ]
        self._gauges = [GaugeReporter(engine) for engine in self.engines]  # late or coarse per profile
        endpoints = [
            Endpoint(f"pod-{i}.sim:8000", name=f"pod-{i}", labels={"gpu": profile.name})
            for i, profile in enumerate(self.profiles)
        ]
        self.addresses = [e.address for e in endpoints]
        self._pod_of = {address: i for i, address in enumerate(self.addresses)}
        self._model_dir: tempfile.TemporaryDirectory[str] | None = None
        if use_predictor:
            self._model_dir = tempfile.TemporaryDirectory(prefix="slorouter-bench-models-")
        self._flow_control = flow_control
        self._kv_recorders: list[KVEventRecorder] = []
        if kv_events:
            self._kv_recorders = [KVEventRecorder.attach(e.kv_blocks, token_ids=False) for e in self.engines]
        self.pickers: list[RouterStack] = []
        for k in range(self.settings.pickers):
            self.pickers.append(
                self._router_stack(
                    k,
                    endpoints,
                    scheduler_config,
                    use_predictor=use_predictor,
                    kv_events=kv_events,
                    seed=seed,
                    trainer_config=trainer_config,
                )
            )
        first = self.pickers[0]
        self.pool = first.pool
        self.tracker = first.tracker
        self.director = first.director
        self.predictor = first.predictor
        self.kv_index = first.kv_index
        self.board: SharedInFlightBoard | None = None
        if self.settings.shared_inflight and len(self.pickers) > 1:
            self.board = SharedInFlightBoard(self.settings.shared_inflight_ttl_s, self.clock)
            for k, stack in enumerate(self.pickers):
                stack.shared = SharedInFlightView(stack.pool, f"picker-{k}", epoch=1)
        # Requests to pickers: drawn from their own generator, so the routers' draws stay as with one picker.
        self._assignment_rng = np.random.default_rng([seed, 0x5049434B])
        self._scrape_all(0.0)

    def _router_stack(
        self,
        k: int,
        endpoints: list[Endpoint],
        scheduler_config: Mapping[str, Any] | None,
        *,
        use_predictor: bool,
        kv_events: bool,
        seed: int,
        trainer_config: TrainerConfig | None,
    ) -> RouterStack:
        """Picker ``k``'s stack; picker 0 is seeded exactly as the single router always was."""
        pool = PoolState(list(endpoints))
        predictor: EmbeddedPredictor | None = None
        if use_predictor and k and self.settings.shared_predictor:
            predictor = self.pickers[0].predictor  # one trainer fed by every picker, as shared sidecars
        elif use_predictor:
            assert self._model_dir is not None
            model_dir = self._model_dir.name
            if k:
                model_dir = f"{model_dir}/picker-{k}"
            config = trainer_config or TrainerConfig(
                retrain_interval_s=self.settings.retrain_interval_s,
                min_samples=self.settings.min_samples,
                nthread=1,
                seed=seed + 1_000_003 * k,
            )
            predictor = EmbeddedPredictor(
                model_dir, trainer_config=config, clock=self.clock, background=False
            )
        kv_index = KVBlockIndex() if kv_events else None
        ctx = PluginContext(
            clock=self.clock,
            rng=np.random.default_rng(seed if k == 0 else [seed, k]),
            pool=pool,
            predictor=predictor,
            kv_index=kv_index,
        )
        setup = build_scheduler_setup(dict(scheduler_config) if scheduler_config else None, ctx)
        tracker = InFlightTracker(pool)
        flow = self._flow_control
        controller = flow.build(pool, self.clock) if flow is not None else None
        director = Director(pool, setup, tracker, self.clock, flow_control=controller)
        return RouterStack(pool, tracker, director, predictor, kv_index)

    def close(self) -> None:
        if self._model_dir is not None:
            self._model_dir.cleanup()
            self._model_dir = None

    def __enter__(self) -> ClusterSimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- run

    def run(
        self,
        requests: Sequence[BenchRequest],
        *,
        progress: Callable[[float], None] | None = None,
    ) -> RunRecords:
        """Simulate the requests (sorted by arrival) to completion or until ``drain_s`` after the last."""
        started = time.perf_counter()
        settings = self.settings
        n = len(requests)
        rec = RunRecords(
            arrival=np.array([r.arrival for r in requests], dtype=np.float64),
            status=np.full(n, UNFINISHED, dtype=np.int32),
            pod=np.full(n, -1, dtype=np.int32),
            ttft_s=_empty(n),
            e2e_s=_empty(n),
            prompt_tokens=np.zeros(n, dtype=np.int64),
            cached_tokens=np.zeros(n, dtype=np.int64),
            output_tokens=np.zeros(n, dtype=np.int64),
            slo_ttft_ms=np.array([_or_nan(r.slo_ttft_ms) for r in requests], dtype=np.float64),
            slo_tpot_ms=np.array([_or_nan(r.slo_tpot_ms) for r in requests], dtype=np.float64),
            predicted=np.zeros(n, dtype=bool),
            predicted_ttft_ms=_empty(n),
            point_ttft_ms=_empty(n),
            predicted_tpot_ms=_empty(n),
            point_tpot_ms=_empty(n),
            pod_profiles=[p.name for p in self.profiles],
            picker=self._assign(n),
            queued_s=_empty(n),
        )
        if n and np.any(np.diff(rec.arrival) < 0):
            raise ValueError("requests must be sorted by arrival time")
        last_arrival = float(rec.arrival[-1]) if n else 0.0
        end = last_arrival + settings.drain_s

        heap: list[tuple[float, int, int, Any]] = []
        seq = itertools.count()
        push = heapq.heappush
        pop = heapq.heappop
        engines = self.engines
        num_pods = len(engines)
        busy: list[Step | None] = [None] * num_pods
        wake_at = [math.inf] * num_pods
        exchanges: dict[int, Exchange] = {}
        net = settings.network_s
        clock = self.clock
        set_clock = clock.set
        model = settings.model
        arrivals_left = n
        steps = events = trainings = 0
        recorders = self._kv_recorders
        kv_indexes = [stack.kv_index for stack in self.pickers if stack.kv_index is not None]
        kv_delay = settings.kv_event_delay_s
        pickers = self.pickers
        board = self.board
        predictors = list({id(s.predictor): s.predictor for s in pickers if s.predictor is not None}.values())

        def kick(pod: int, now: float) -> None:
            if busy[pod] is not None:
                return
            engine = engines[pod]
            step = engine.plan_step(now)
            if step is not None:
                busy[pod] = step
                push(heap, (step.end, next(seq), _STEP_END, pod))
                return
            ready = engine.next_ready_time()
            if ready is not None and ready < wake_at[pod]:
                wake_at[pod] = ready
                push(heap, (ready, next(seq), _WAKE, pod))

        for i in range(n):
            push(heap, (float(rec.arrival[i]), next(seq), _ARRIVAL, i))
        push(heap, (settings.scrape_interval_s, next(seq), _SCRAPE, None))
        if predictors:
            push(heap, (settings.train_poll_s, next(seq), _TRAIN, None))
        publish_every = settings.shared_inflight_interval_s
        on_change = board is not None and settings.shared_inflight_publishing == "on-change"
        publishing = [False] * len(pickers)  # an on-change publication is due (after the current event)

        def changed(k: int, now: float) -> None:
            if not publishing[k]:
                publishing[k] = True
                push(heap, (now, next(seq), _PUBLISH_CHANGE, k))

        if board is not None:  # each picker on its own phase, as unsynchronised processes would be
            for k in range(len(pickers)):
                push(heap, (publish_every * (k + 1) / len(pickers), next(seq), _PUBLISH, k))
        next_progress = 0.0
        # Flow control: requests that left a queue (the controller's callback), routed after each event.
        released: list[tuple[int, InferenceRequest, Ticket]] = []
        flow_timer = [math.inf] * len(pickers)

        def route(k: int, i: int, inference: InferenceRequest, admission: Admission, now: float) -> None:
            self._route(pickers[k], i, inference, admission, now, rec, exchanges, kick)
            if on_change:
                changed(k, now)

        def after_event(now: float) -> None:
            while released:
                i, inference, ticket = released.pop(0)
                k = int(rec.picker[i])
                try:
                    admission = pickers[k].director.admitted(ticket)
                except SchedulingError as exc:
                    rec.status[i] = exc.status
                    continue
                route(k, i, inference, admission, now)
            for k, stack in enumerate(pickers):
                controller = stack.director.flow_control
                if controller is None or not len(controller):
                    continue
                wake = controller.next_wakeup()
                if wake is not None and wake < flow_timer[k]:
                    flow_timer[k] = wake
                    push(heap, (wake, next(seq), _FLOW, k))

        while heap:
            now, _, kind, arg = pop(heap)
            if now > end:
                break
            events += 1
            set_clock(now)
            if kind == _STEP_END:
                pod = arg
                step = busy[pod]
                assert step is not None
                busy[pod] = None
                out = engines[pod].commit_step(step, now)
                steps += 1
                for first in out.first_tokens:
                    push(heap, (first.time + net, next(seq), _FIRST_TOKEN, first))
                for done in out.finished:
                    push(heap, (done.done_time + net, next(seq), _DONE, done))
                if recorders:
                    kv_events = recorders[pod].drain()
                    if kv_events:
                        push(
                            heap, (now + kv_delay, next(seq), _KV_EVENTS, (pod, KVEventBatch(now, kv_events)))
                        )
                kick(pod, now)
            elif kind == _FIRST_TOKEN:
                first_token: FirstToken = arg
                i = _index(first_token.request_id)
                exchange = exchanges.get(i)
                if exchange is not None:
                    exchange.started(200, True, bytes_follow=False)
                    exchange.tokens(1)
                    rec.ttft_s[i] = now - rec.arrival[i]
                    if on_change:
                        changed(int(rec.picker[i]), now)
            elif kind == _DONE:
                finished: Finished = arg
                i = _index(finished.request_id)
                exchange = exchanges.pop(i, None)
                if exchange is not None:
                    assert exchange.lifecycle is not None
                    wanted = exchange.lifecycle.reply_chars_wanted
                    if wanted > 0:  # the engine's reply is output_text(0, n): ASCII, BYTES_PER_TOKEN a token
                        tokens = min(finished.output_tokens, -(-wanted // BYTES_PER_TOKEN))
                        exchange.reply_text(output_text(0, tokens))
                    exchange.answered(
                        usage={
                            "prompt_tokens": finished.prompt_tokens,
                            "completion_tokens": finished.output_tokens,
                        }
                    )
                    rec.status[i] = OK
                    rec.e2e_s[i] = now - rec.arrival[i]
                    rec.output_tokens[i] = finished.output_tokens
                    rec.cached_tokens[i] = finished.cached_tokens
                    if on_change:
                        changed(int(rec.picker[i]), now)
            elif kind == _ARRIVAL:
                i = arg
                arrivals_left -= 1
                k = int(rec.picker[i])
                inference = self._arrive(i, requests[i], now, model, rec)
                director = pickers[k].director
                if director.flow_control is None:
                    route(k, i, inference, NOT_QUEUED, now)
                else:
                    ticket = director.admit(inference, _releaser(released, i, inference))
                    if ticket.rejection is not None:
                        rec.status[i] = SHED
                if progress is not None and now >= next_progress:
                    progress(now)
                    next_progress = now + 1.0
            elif kind == _WAKE:
                pod = arg
                if wake_at[pod] == now:
                    wake_at[pod] = math.inf
                    kick(pod, now)
            elif kind == _FLOW:
                flow_timer[arg] = math.inf
                controller = pickers[arg].director.flow_control
                assert controller is not None
                controller.service()
            elif kind == _SCRAPE:
                self._scrape_all(now)
                for stack in pickers:  # new engine signals: maybe room
                    if stack.director.flow_control is not None:
                        stack.director.flow_control.service()
                # After the last arrival only requests still held by flow control read them.
                if arrivals_left or any(
                    stack.director.flow_control is not None and len(stack.director.flow_control)
                    for stack in pickers
                ):
                    push(heap, (now + settings.scrape_interval_s, next(seq), _SCRAPE, None))
            elif kind == _KV_EVENTS:
                for kv_index in kv_indexes:  # every picker subscribes to every pod's events
                    kv_index.apply(self.addresses[arg[0]], arg[1])
            elif kind == _TRAIN:
                for predictor in predictors:
                    trainings += len(predictor.maybe_train())
                if arrivals_left:
                    push(heap, (now + settings.train_poll_s, next(seq), _TRAIN, None))
            elif kind == _PUBLISH:
                shared = pickers[arg].shared
                assert shared is not None
                push(
                    heap, (now + settings.shared_inflight_delay_s, next(seq), _DELIVER, shared.publication())
                )
                if arrivals_left:
                    push(heap, (now + publish_every, next(seq), _PUBLISH, arg))
            elif kind == _PUBLISH_CHANGE:
                publishing[arg] = False
                shared = pickers[arg].shared
                assert shared is not None
                push(
                    heap, (now + settings.shared_inflight_delay_s, next(seq), _DELIVER, shared.publication())
                )
            elif kind == _DELIVER:
                assert board is not None
                if board.receive(arg):
                    for stack in pickers:
                        if stack.shared is not None and stack.shared.picker != arg.picker:
                            stack.shared.refresh(board)
            after_event(now)

        for exchange in exchanges.values():  # still running at the end: release their in-flight load
            exchange.abandoned(Termination.CANCELLED, "the simulation ended before the request finished")
        for stack in pickers:  # and the others' published load folded into each picker's counts
            if stack.shared is not None:
                stack.shared.detach()
        if progress is not None:
            progress(clock.now())
        rec.virtual_s = clock.now()
        rec.wall_s = time.perf_counter() - started
        rec.steps, rec.events, rec.trainings = steps, events, trainings
        rec.facts = self._facts()
        return rec

    def _assign(self, n: int) -> np.ndarray:
        """The picker of each of ``n`` requests (in arrival order)."""
        count = self.settings.pickers
        if count == 1:
            return np.zeros(n, dtype=np.int32)
        if self.settings.picker_assignment == "round-robin":
            return (np.arange(n) % count).astype(np.int32)
        return self._assignment_rng.integers(0, count, size=n).astype(np.int32)

    def _arrive(
        self, i: int, request: BenchRequest, now: float, model: str, rec: RunRecords
    ) -> InferenceRequest:
        prompt_tokens = len(encode_bytes(request.prompt)) // BYTES_PER_TOKEN
        rec.prompt_tokens[i] = prompt_tokens
        return InferenceRequest(
            request_id=str(i),
            model=model,
            prompt_text=request.prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=request.max_tokens,
            stream=True,
            priority=request.priority,
            slo_ttft_ms=request.slo_ttft_ms,
            slo_tpot_ms=request.slo_tpot_ms,
            received_at=now,
            history_form=TEXT,  # completions: the next turn's prompt is this prompt followed by the reply
            headers={FAIRNESS_HEADER: request.tenant} if request.tenant else {},
        )

    def _route(
        self,
        stack: RouterStack,
        i: int,
        inference: InferenceRequest,
        admission: Admission,
        now: float,
        rec: RunRecords,
        exchanges: dict[int, Exchange],
        kick: Callable[[int, float], None],
    ) -> None:
        """Schedule (on the load of ``now``: after the queue, when there is one), dispatch, and send."""
        rec.queued_s[i] = admission.queued_s
        exchange = Exchange.of(stack.front, inference)
        exchange.admission = admission
        try:
            lifecycle = exchange.pick_now()
        except SchedulingError as exc:
            rec.status[i] = exc.status
            return
        pod = self._pod_of[lifecycle.target.address]
        rec.pod[i] = pod
        prediction = lifecycle.prediction
        if prediction is not None and stack.predictor is not None:
            ttft, tpot = prediction.ttft_ms, prediction.tpot_ms
            rec.predicted[i] = True
            rec.predicted_ttft_ms[i] = ttft
            # The point prediction is the model's: without the live-coverage factor of the served quantile.
            point_factor = stack.predictor.predictor.point_factor
            rec.point_ttft_ms[i] = ttft / prediction.ttft_coverage_factor * point_factor("ttft")
            if tpot is not None and tpot > 0:  # 0: no TPOT model yet (the producer's "unconstrained")
                rec.predicted_tpot_ms[i] = tpot
                rec.point_tpot_ms[i] = tpot / prediction.tpot_coverage_factor * point_factor("tpot")
        prompt = encode_bytes(inference.prompt_text)  # what the HTTP simulator's tokenizer gives the engine
        try:
            self.engines[pod].add_request(i, prompt, inference.max_tokens, now + self.settings.network_s)
        except RequestRejected as exc:
            exchange.failed(Termination.UPSTREAM_ERROR, str(exc), "rejected")
            rec.status[i] = REJECTED
            return
        exchanges[i] = exchange
        kick(pod, now)

    def _scrape_all(self, now: float) -> None:
        """One scrape of every pod, the same snapshot for every picker (they scrape the same pods)."""
        pools = [stack.pool for stack in self.pickers]
        for address, engine, reporter in zip(self.addresses, self.engines, self._gauges, strict=True):
            gauges = reporter.read(now)
            snapshot = MetricsSnapshot(
                waiting=gauges.waiting,
                running=gauges.running,
                kv_usage=gauges.kv_usage,
                block_size=engine.block_size,
                num_gpu_blocks=engine.num_gpu_blocks,
            )
            for pool in pools:
                pool.set_metrics(address, snapshot, now)

    def _facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "preemptions": sum(e.num_preemptions_total for e in self.engines),
            "leaked_inflight": sum(stack.tracker.leaked() for stack in self.pickers),
        }
        if len(self.pickers) > 1:
            facts["pickers"] = len(self.pickers)
        if self.predictor is not None:
            facts["model_versions"] = self.predictor.versions
            facts["trainer"] = {
                kind: {
                    k: v for k, v in status.items() if k in ("samples", "trainings", "accepted", "metrics")
                }
                for kind, status in self.predictor.trainer.status()["models"].items()
            }
        return facts


def _releaser(
    released: list[tuple[int, InferenceRequest, Ticket]], i: int, inference: InferenceRequest
) -> Callable[[Ticket], None]:
    """Flow control's callback for request ``i``: noted, and routed once the current event is done."""

    def on_outcome(ticket: Ticket) -> None:
        released.append((i, inference, ticket))

    return on_outcome


def _index(request_id: RequestId) -> int:
    """The engines here know each request by its index in the run."""
    assert isinstance(request_id, int)
    return request_id


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)
