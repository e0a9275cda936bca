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
  publisher → subscriber path of the gateway, without the encoding). With ``kv_event_drop`` that share of
  the batches is lost for good (drawn per batch, seeded): the pod's next batch shows the gap, and the
  pod's blocks are cleared before it is applied, as the subscriber does when the replay cannot fill a gap.
  With ``kv_trust`` the cleared pod is then ``rebuilding`` (``slorouter.pool.kv_trust``) and routed on the
  approximate estimate until rebuilt; without it its index is used at once, as before the trust states.
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

The event loop and its handlers, one per kind of event, are ``bench/events.py``; what a run records is
``bench/records.py``.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from slorouter.bench.events import SimulationRun
from slorouter.bench.records import RunRecords
from slorouter.bench.workloads import BenchRequest
from slorouter.clock import ManualClock
from slorouter.director import Director
from slorouter.flowcontrol.config import FlowControlConfig
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_trust import TrustThresholds
from slorouter.pool.shared_inflight import SharedInFlightBoard, SharedInFlightView
from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
from slorouter.predictor.embedded import EmbeddedPredictor
from slorouter.predictor.ledger import LedgerSettings, PredictionLedger
from slorouter.predictor.model_store import ModelMetadata, ModelStore
from slorouter.predictor.trainer import TrainerConfig
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.plugin import PluginContext
from slorouter.serving.audit import PickAudit
from slorouter.serving.exchange import FrontEnd
from slorouter.serving.regret import RegretLedger
from slorouter.serving.slo_actions import SloActions, totals
from slorouter.serving.switch_guard import SwitchGuard
from slorouter.serving.traffic_window import TrafficWindow, WindowEntry
from slorouter.sim.engine import Engine
from slorouter.sim.gauges import GaugeReporter
from slorouter.sim.kv_events import KVEventRecorder
from slorouter.sim.profiles import Profile

if TYPE_CHECKING:
    from slorouter.bench.policies import Deadlines, Policy
    from slorouter.bench.tuning.tuner import Tuner, TuningRound, TuningSettings

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
    kv_event_drop: float = 0.0  # share of KV-event batches lost for good (each gap clears the pod's blocks)
    # A pod cleared by a gap rebuilds on the approximate estimate, by these thresholds; None: used at once.
    kv_trust: TrustThresholds | None = field(default_factory=TrustThresholds)
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
    training: bool = True  # False: the predictor serves the models it was given and never trains
    # The prediction ledger of each picker with a predictor, as the router keeps it (its drift asks for a
    # retrain and, past fallback_after_s, routes by the heuristic profile); None: none is kept.
    ledger: LedgerSettings | None = None

    def __post_init__(self) -> None:
        if self.scrape_interval_s <= 0 or self.train_poll_s <= 0:
            raise ValueError("scrape_interval_s and train_poll_s must be > 0")
        if self.network_s < 0 or self.drain_s < 0 or self.retrain_interval_s < 0 or self.kv_event_delay_s < 0:
            raise ValueError("network_s, drain_s, retrain_interval_s and kv_event_delay_s must be >= 0")
        if self.pickers < 1:
            raise ValueError(f"pickers must be >= 1 (got {self.pickers})")
        if not 0 <= self.kv_event_drop < 1:
            raise ValueError(f"kv_event_drop must be in [0, 1) (got {self.kv_event_drop})")
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
class RouterStack:
    """One picker: its pool view (shared scraped signals, its own in-flight counts), plugins, director."""

    pool: PoolState
    tracker: InFlightTracker
    director: Director
    predictor: EmbeddedPredictor | None
    kv_index: KVBlockIndex | None
    shared: SharedInFlightView | None = None
    actions: SloActions | None = None  # +slo policies: deadlines and hedges
    ledger: PredictionLedger | None = None  # settings.ledger: its predictions paired with their outcomes
    front: FrontEnd = field(init=False)

    def __post_init__(self) -> None:
        audit = PickAudit(regret=RegretLedger())  # every run reports its routing regret
        self.front = FrontEnd(self.director, "bench", actions=self.actions, audit=audit)


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
        tuning: TuningSettings | None = None,
        deadlines: Deadlines | None = None,
        engine_priority: bool = False,
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
        self.pod_of = {address: i for i, address in enumerate(self.addresses)}
        self._model_dir: tempfile.TemporaryDirectory[str] | None = None
        if use_predictor:
            self._model_dir = tempfile.TemporaryDirectory(prefix="slorouter-bench-models-")
        self._flow_control = flow_control
        self._deadlines = deadlines
        self.engine_priority = engine_priority  # +prio: each request's priority reaches its pod's engine
        self.kv_recorders: list[KVEventRecorder] = []
        if kv_events:
            self.kv_recorders = [KVEventRecorder.attach(e.kv_blocks, token_ids=False) for e in self.engines]
        self.kv_drops = random.Random(f"slorouter-bench-kv-drop-{seed}")  # which batches kv_event_drop loses
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
        # The self-tuning policy: every picker keeps a window; picker 0's tuner decides for all of them.
        self.tuner: Tuner | None = None
        self.guard: SwitchGuard | None = None  # watches each switch the tuner makes
        self.tuning_log: list[dict[str, Any]] = []  # one entry per round
        if tuning is not None:
            if first.director.setup.candidate_switch is None:
                raise ValueError("a tuned policy needs a candidate-profile-handler")
            from slorouter.bench.tuning.tuner import Tuner  # the tuner replays on this simulator

            self.tuner = Tuner(scheduler_config or {}, tuning, cluster=self.settings)
            self.guard = SwitchGuard()
            for stack in self.pickers:
                stack.front.window = TrafficWindow(span_s=tuning.window_s * 1.5)
        # Requests to pickers: drawn from their own generator, so the routers' draws stay as with one picker.
        self._assignment_rng = np.random.default_rng([seed, 0x5049434B])
        self.scrape_all(0.0)

    @classmethod
    def of_policy(
        cls,
        profiles: Sequence[Profile],
        policy: Policy,
        *,
        settings: ClusterSettings | None = None,
        seed: int = 0,
        trainer_config: TrainerConfig | None = None,
    ) -> ClusterSimulator:
        """The simulator a benchmark policy runs on: its scheduler, predictor, KV events, flow control,
        tuner, deadlines and engine priority, all from the policy."""
        return cls(
            profiles,
            policy.config,
            use_predictor=policy.uses_predictor,
            kv_events=policy.uses_kv_events,
            settings=settings,
            seed=seed,
            trainer_config=trainer_config,
            flow_control=policy.flow_control,
            tuning=policy.tuning,
            deadlines=policy.deadlines,
            engine_priority=policy.engine_priority,
        )

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
        kv_trust = self.settings.kv_trust
        kv_index = KVBlockIndex(trust=kv_trust, clock=self.clock) if kv_events else None
        ledger = None
        if predictor is not None and self.settings.ledger is not None:
            ledger = PredictionLedger.of_backend(self.clock, self.settings.ledger, predictor)
        ctx = PluginContext(
            clock=self.clock,
            rng=np.random.default_rng(seed if k == 0 else [seed, k]),
            pool=pool,
            predictor=predictor,
            kv_index=kv_index,
            ledger=ledger,
        )
        setup = build_scheduler_setup(dict(scheduler_config) if scheduler_config else None, ctx)
        tracker = InFlightTracker(pool)
        flow = self._flow_control
        controller = flow.build(pool, self.clock) if flow is not None else None
        # Pick records draw no random numbers: the picks are those of a director without them.
        director = Director(pool, setup, tracker, self.clock, flow_control=controller, record_picks=True)
        deadlines = self._deadlines
        actions = None if deadlines is None else SloActions(deadlines.objectives, deadlines.hedging)
        return RouterStack(pool, tracker, director, predictor, kv_index, actions=actions, ledger=ledger)

    def tune(self, now: float) -> TuningRound:
        """One round of the tuner on the pickers' windows; a switch applies to every picker."""
        tuner, first = self.tuner, self.pickers[0]
        assert tuner is not None and first.front.window is not None
        switch = first.director.setup.candidate_switch
        assert switch is not None
        models: list[tuple[bytes, ModelMetadata]] = []
        if first.predictor is not None:
            store = ModelStore(first.predictor.model_dir)
            models = [m for m in (store.load("ttft"), store.load("tpot")) if m is not None]
        pool = first.pool
        capacity = {
            a: (int(pool.value(a, "num_gpu_blocks")), int(pool.value(a, "block_size")))
            for a in self.addresses
        }
        # Every picker's window: the pods serve all of them, and so must the twin.
        entries = [
            e
            for stack in self.pickers
            if stack.front.window is not None
            for e in stack.front.window.entries()
        ]
        result = tuner.tune(
            entries,
            now=now,
            active=switch.active,
            addresses=self.addresses,
            capacity=capacity,
            models=models,
        )
        if result.switch_to is not None:
            self.activate(result.switch_to)
            assert self.guard is not None
            if result.switch_to != tuner.default:  # going back to the configured candidate is not watched
                self.guard.switched(at=now, previous=result.active)
            else:
                self.guard.watch = None
        return result

    def window_entries(self) -> list[WindowEntry]:
        """Every picker's window: the pods serve all of them, and so must the twin."""
        return [
            e
            for stack in self.pickers
            if stack.front.window is not None
            for e in stack.front.window.entries()
        ]

    def guard_check(self, now: float) -> str | None:
        """The guard's check of the last switch: the candidate switched back to, when it collapsed."""
        tuner, guard = self.tuner, self.guard
        assert tuner is not None and guard is not None
        watch = guard.watch
        window = self.pickers[0].front.window
        assert window is not None
        back = guard.check(window, now)
        if back is not None and watch is not None:
            self.activate(back)
            tuner.reverted(now, back)
        return back

    def load_models(self, models: Sequence[tuple[bytes, ModelMetadata]]) -> None:
        """Serve these models (a booster's bytes and its metadata, one per kind) in every picker's predictor,
        as if trained (the tuner's twin starts from the live router's models)."""
        for stack in self.pickers:
            if stack.predictor is not None:
                for raw, metadata in models:
                    stack.predictor.predictor.load_raw(metadata.kind, raw, metadata)

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
        switches: Sequence[tuple[float, str]] = (),
    ) -> RunRecords:
        """Simulate the requests (sorted by arrival) to completion or until ``drain_s`` after the last;
        ``switches``: (time, candidate) at which every picker's candidate switch changes (the tuner's replay
        of a window during which the live router switched)."""
        return SimulationRun(self, requests, progress, switches).execute()

    def activate(self, candidate: str) -> None:
        """Every picker routes by ``candidate`` from now on."""
        for stack in self.pickers:
            switch = stack.director.setup.candidate_switch
            if switch is None:
                raise ValueError("the policy has no candidate switch")
            switch.activate(candidate)

    def assign_pickers(self, n: int) -> np.ndarray:
        """The picker of each of ``n`` requests (in arrival order)."""
        count = self.settings.pickers
        if count == 1:
            return np.zeros(n, dtype=np.int32)
        if self.settings.picker_assignment == "round-robin":
            return (np.arange(n) % count).astype(np.int32)
        return self._assignment_rng.integers(0, count, size=n).astype(np.int32)

    def scrape_all(self, now: float) -> None:
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

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "preemptions": sum(e.num_preemptions_total for e in self.engines),
            "leaked_inflight": sum(stack.tracker.leaked() for stack in self.pickers),
        }
        if len(self.pickers) > 1:
            facts["pickers"] = len(self.pickers)
        if self.tuner is not None:
            facts["tuning"] = self.tuning_log
        actions = [stack.actions for stack in self.pickers if stack.actions is not None]
        if actions:
            facts["slo_actions"] = {
                "hedges": totals(*(a.hedges for a in actions)),
                "hedges_skipped": totals(*(a.skipped for a in actions)),
                "cancelled": totals(*(a.cancelled for a in actions)),
                "loser_prefill_tokens": sum(a.loser_prefill_tokens for a in actions),
            }
        if self.predictor is not None:
            facts["model_versions"] = self.predictor.versions
            facts["trainer"] = {
                kind: {
                    k: v for k, v in status.items() if k in ("samples", "trainings", "accepted", "metrics")
                }
                for kind, status in self.predictor.trainer.status()["models"].items()
            }
        return facts
