"""Assembling a router from the YAML config: pool, scraper, KV-event subscribers, in-flight tracker,
latency predictor, scheduler and Director. Every front-end (the HTTP gateway, the Envoy ext_proc picker)
builds the same ``RouterCore`` from the same file and adds only its own serving on top."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from slorouter.clock import Clock, MonotonicClock
from slorouter.config import Config, ConfigError, PredictorConfig, RemotePredictorConfig
from slorouter.director import Director
from slorouter.discovery.start import DiscoveryHandle, KubernetesConfigError, start_discovery
from slorouter.flowcontrol.metrics import FlowControlMetrics
from slorouter.metrics import (
    DiscoveryMetrics,
    GatewayMetrics,
    KVEventsCollector,
    LatencyMetrics,
    PredictorCollector,
)
from slorouter.pool.config import endpoints_from_config
from slorouter.pool.inflight import InFlightTracker
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_subscriber import KVEventSubscriber, subscribers_from_config
from slorouter.pool.kv_trust_monitor import KVTrustMonitor
from slorouter.pool.scraper import MetricsScraper
from slorouter.pool.state import PoolState
from slorouter.predictor.backend import LatencyPredictorBackend
from slorouter.predictor.breaker import BreakerConfig
from slorouter.predictor.embedded import EmbeddedPredictor
from slorouter.predictor.ledger import DEFAULT_QUANTILE, LedgerCollector, LedgerSettings, PredictionLedger
from slorouter.predictor.pool_shape import PoolShape
from slorouter.predictor.prediction_client import PredictionClient
from slorouter.predictor.remote import RemotePredictor
from slorouter.predictor.sample_sink import TrainingSampleSink
from slorouter.predictor.state_dir import StateDirBusyError, default_state_dir, state_key
from slorouter.predictor.store import StoreConfig
from slorouter.predictor.trainer import TrainerConfig
from slorouter.scheduling.loader import build_scheduler_setup
from slorouter.scheduling.pipelines import PREDICTED_LATENCY_SCHEDULER_CONFIG, SELF_TUNING_SCHEDULER_CONFIG
from slorouter.scheduling.plugin import CandidateSwitch, PluginContext
from slorouter.serving.audit import PickAudit
from slorouter.serving.command_line import STATE_DIR_CHANGE
from slorouter.serving.engine_priority import EnginePriority
from slorouter.serving.self_tuning import SelfTuning
from slorouter.serving.slo_actions import SloActions, SloActionsCollector
from slorouter.tracing.config import TracingUnavailableError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from slorouter.tracing.tracer import Tracing
from slorouter.serving.status import LedgerStatus, RouterStats, RouterStatus

log = logging.getLogger(__name__)


@dataclass
class RouterCore:
    """The routing half of a running router, without any front-end."""

    config: Config
    clock: Clock
    pool: PoolState
    director: Director
    scraper: MetricsScraper
    metrics: GatewayMetrics
    predictor: LatencyPredictorBackend | None = None
    kv_subscribers: list[KVEventSubscriber] = field(default_factory=list)  # of static endpoints
    discovery: DiscoveryHandle | None = None
    kv_index: KVBlockIndex | None = None
    kv_trust_monitor: KVTrustMonitor | None = None  # with kv_index: the scrapes' view of its trust
    discovery_metrics: DiscoveryMetrics | None = None
    tracing: Tracing | None = None  # None: tracing is off (the front-ends check it once per request)
    stats: RouterStats | None = None  # the status page's per-request figures, fed by the front-end
    tuning: SelfTuning | None = None  # tuning.enabled: the tuner's link and the window it reads
    actions: SloActions | None = None  # an objective has a deadline: the plans and their counts
    engine_priority: EnginePriority | None = None  # pool.engine_priority: what the model servers are sent
    ledger: PredictionLedger | None = None  # a predictor: each routed request's prediction and outcome
    audit: PickAudit | None = None  # the audit section: routing regret, scores on the wire

    @classmethod
    def build(
        cls,
        config: Config,
        clock: Clock | None = None,
        *,
        state_name: str = "serve",
        config_path: str | Path | None = None,
        span_exporter: SpanExporter | None = None,
    ) -> RouterCore:
        """The embedded predictor's default state directory is ``<state_name>/<key>``: ``state_name`` per
        front-end (a gateway and a picker on one machine do not contend for it), the key from
        ``config_path``, the file ``config`` was read from (None: the embedded default), so that routers of
        two configurations do not either. ``span_exporter``: where the spans go instead of the configured
        OTLP collector (tests), when ``tracing.enabled``."""
        if config.pool is None:
            raise ConfigError("config: 'pool' is required (pool.endpoints or pool.kubernetes)")
        try:
            tracing = config.tracing.build(span_exporter)
        except TracingUnavailableError as exc:
            raise ConfigError(f"tracing.enabled: {exc}") from None
        clock = clock or MonotonicClock()
        pool = PoolState(
            endpoints_from_config(config.pool),
            fallback_kv_capacity_tokens=config.pool.fallback_kv_capacity_tokens,
        )
        metrics = GatewayMetrics(pool, max_model_label_sets=config.gateway.max_model_label_sets)
        ctx = PluginContext(clock=clock, rng=np.random.default_rng(config.seed), pool=pool)
        kv_subscribers: list[KVEventSubscriber] = []
        discovery_metrics = None
        # Discovered pods may publish KV events (their annotations say so) whatever the config says.
        if config.pool.kubernetes is not None or any(e.kv_events is not None for e in config.pool.endpoints):
            ctx.kv_index = KVBlockIndex(
                config.pool.kv_events_max_blocks_per_pod, trust=config.pool.kv_trust_thresholds(), clock=clock
            )
            kv_subscribers = subscribers_from_config(config.pool, ctx.kv_index)
            metrics.registry.register(KVEventsCollector(ctx.kv_index, pool))
        if config.pool.kubernetes is not None:
            discovery_metrics = DiscoveryMetrics(metrics.registry)
        scheduler_config = config.scheduler
        predictor = None
        if config.predictor is not None and config.predictor.mode != "off":
            state_dir = predictor_state_dir(config, state_name, config_path)
            predictor = _build_predictor(config.predictor, clock, metrics, pool, state_dir)
            ctx.predictor = predictor
            ctx.metrics = LatencyMetrics(metrics.registry, metrics.model_labels)
            metrics.registry.register(PredictorCollector(predictor))
            if config.predictor.ledger.enabled:
                ctx.ledger = build_ledger(config.predictor, clock, predictor, pool)
                metrics.registry.register(LedgerCollector(ctx.ledger))
            if scheduler_config is None and not config.tuning.enabled:
                scheduler_config = PREDICTED_LATENCY_SCHEDULER_CONFIG
        if scheduler_config is None and config.tuning.enabled:
            scheduler_config = SELF_TUNING_SCHEDULER_CONFIG
        setup = build_scheduler_setup(scheduler_config, ctx)
        tracker = InFlightTracker(pool)
        flow_control = None
        if config.flow_control_enabled:
            flow_control = config.flow_control.build(pool, clock, FlowControlMetrics(metrics.registry))
        audit = PickAudit.from_config(config.audit, metrics.registry)
        director = Director(
            pool,
            setup,
            tracker,
            clock,
            latency_metrics=ctx.metrics,
            flow_control=flow_control,
            record_picks=audit is not None,
        )
        tracker.register_metrics(metrics.registry)
        scraper = MetricsScraper.from_config(pool, clock, config.pool)
        tuning = None
        if config.tuning.enabled:
            tuning = _build_tuning(
                config, setup.candidate_switch, pool, clock, metrics, predictor, scheduler_config
            )
        actions = SloActions(config.objectives, config.hedging)
        if actions.enabled:
            metrics.registry.register(SloActionsCollector(actions))
        return cls(
            config,
            clock,
            pool,
            director,
            scraper,
            metrics,
            predictor,
            kv_subscribers,
            kv_index=ctx.kv_index,
            kv_trust_monitor=None if ctx.kv_index is None else KVTrustMonitor(pool, ctx.kv_index, clock),
            discovery_metrics=discovery_metrics,
            tracing=tracing,
            stats=RouterStats(clock),
            tuning=tuning,
            actions=actions if actions.enabled else None,
            engine_priority=EnginePriority.from_config(config),
            ledger=ctx.ledger,
            audit=audit,
        )

    @property
    def objectives(self) -> dict[str, int]:
        return self.config.objective_priorities()

    @property
    def prediction_by_default(self) -> bool:
        return bool(self.config.predictor and self.config.predictor.prediction_by_default)

    def status(self, front_end: str) -> RouterStatus:
        """The status page (``GET /v1/router/status``) of this router, served by ``front_end``."""
        if self.stats is None:
            self.stats = RouterStats(self.clock)
        flow_control = self.director.flow_control
        return self.stats.status(
            front_end,
            self.pool,
            predictor_mode=self.config.predictor.mode if self.config.predictor is not None else "off",
            predictor=self.predictor,
            queued=None if flow_control is None else len(flow_control),
            tuning=None if self.tuning is None else self.tuning.status(),
            deadlines=None if self.actions is None else self.actions.status(),
            ledger=None if self.ledger is None else LedgerStatus.of(self.ledger.summary()),
            kv_trust=None if self.kv_index is None else self.kv_index.trust.views(),
            regret=None if self.audit is None or self.audit.regret is None else self.audit.regret.status(),
        )

    async def start(self) -> None:
        """Discover the pool (Kubernetes), scrape every endpoint once, then keep scraping; start the KV-event
        subscribers and the predictor."""
        assert self.config.pool is not None
        try:
            self.discovery = await start_discovery(
                self.config.pool, self.pool, kv_index=self.kv_index, observer=self.discovery_metrics
            )
        except KubernetesConfigError as exc:
            raise ConfigError(f"pool.kubernetes: {exc}") from None
        await self.scraper.scrape_once()
        self.scraper.start()
        for subscriber in self.kv_subscribers:
            subscriber.start()
        if self.kv_trust_monitor is not None:
            self.kv_trust_monitor.start()
        if self.predictor is not None:
            try:
                self.predictor.start()
            except StateDirBusyError as exc:
                raise StateDirBusyError(f"{exc} ({STATE_DIR_CHANGE})") from None
        if self.tuning is not None:
            self.tuning.start()

    async def stop(self) -> None:
        if self.tuning is not None:
            await self.tuning.stop()
        if self.director.flow_control is not None:
            await self.director.flow_control.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        await self.scraper.stop()
        for subscriber in self.kv_subscribers:
            await subscriber.stop()
        if self.kv_trust_monitor is not None:
            await self.kv_trust_monitor.stop()
        if self.predictor is not None:
            await self.predictor.stop()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # exports the spans still batched


def _build_tuning(
    config: Config,
    switch: CandidateSwitch | None,
    pool: PoolState,
    clock: Clock,
    metrics: GatewayMetrics,
    predictor: LatencyPredictorBackend | None,
    pipeline: dict[str, Any] | None,
) -> SelfTuning:
    if switch is None or pipeline is None:
        raise ConfigError(
            "tuning.enabled: the scheduler has no candidate-profile-handler to switch; omit the scheduler "
            "section for the built-in self-tuning pipeline, or give one with candidates (docs/self-tuning.md)"
        )
    assert config.pool is not None
    try:
        return SelfTuning(
            config.tuning,
            switch,
            pool,
            clock,
            metrics.registry,
            pipeline=dict(pipeline),
            models_dir=predictor.model_dir if isinstance(predictor, EmbeddedPredictor) else None,
            cluster={"scrape_interval_s": config.pool.scrape_interval_s},
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _breaker_config(remote: RemotePredictorConfig) -> BreakerConfig:
    breaker = remote.breaker
    budget_ms = breaker.latency_budget_ms if breaker.latency_budget_ms is not None else remote.timeout_ms
    return BreakerConfig(
        failures=breaker.failures,
        latency_budget_s=budget_ms / 1000,
        window=breaker.window,
        min_exchanges=min(20, breaker.window),
        cooldown_s=breaker.cooldown_s,
        max_cooldown_s=breaker.max_cooldown_s,
        probe_timeout_s=max(1.0, 2 * remote.timeout_ms / 1000),
    )


def predictor_state_dir(config: Config, state_name: str, config_path: str | Path | None) -> Path | None:
    """Where the embedded predictor of ``config`` keeps its state (``RouterCore.build`` says how the default
    is chosen); None without an embedded predictor or with ``persist: false`` (a temporary directory)."""
    if config.predictor is None or config.predictor.mode != "embedded":
        return None
    embedded = config.predictor.embedded
    if not embedded.persist:
        return None
    if embedded.state_dir:
        return Path(embedded.state_dir).expanduser()
    return default_state_dir(state_name, state_key(config_path))


def build_ledger(
    config: PredictorConfig, clock: Clock, predictor: LatencyPredictorBackend, pool: PoolState
) -> PredictionLedger:
    """The prediction ledger of ``config.ledger``; a drift asks ``predictor`` for a retrain."""
    ledger = config.ledger
    low, high = ledger.coverage_band
    settings = LedgerSettings(
        window_s=ledger.window_s,
        max_entries=ledger.max_entries,
        quantile=config.embedded.quantile if config.mode == "embedded" else DEFAULT_QUANTILE,
        coverage_low=low,
        coverage_high=high,
        min_outcomes=ledger.min_outcomes,
        drift_after_s=ledger.drift_after_s,
        fallback_after_s=ledger.fallback_after_s,
        check_interval_s=min(5.0, ledger.drift_after_s / 2),
    )
    return PredictionLedger.of_backend(
        clock, settings, predictor, members=lambda: (e.address for e in pool.endpoints)
    )


def _build_predictor(
    config: PredictorConfig, clock: Clock, metrics: GatewayMetrics, pool: PoolState, state_dir: Path | None
) -> LatencyPredictorBackend:
    if config.mode == "remote":
        assert config.remote is not None
        remote = config.remote
        client = PredictionClient(
            remote.prediction_servers,
            registry=metrics.registry,
            timeout_s=remote.timeout_ms / 1000,
            coalesce_window_s=remote.coalesce_window_ms / 1000,
            tokens=remote.tokens,
            breaker=_breaker_config(remote),
            stale_after_s=remote.stale_after_s,
        )
        sink = TrainingSampleSink(
            remote.training_server,
            flush_interval_s=remote.flush_interval_s,
            max_buffer=remote.max_buffered_samples,
            registry=metrics.registry,
            pool_shape=lambda: PoolShape.of(pool),
            tokens=remote.tokens,
        )
        return RemotePredictor(client, sink)
    embedded = config.embedded
    trainer = TrainerConfig(
        objective=embedded.objective,
        quantile=embedded.quantile,
        n_estimators=embedded.n_estimators,
        max_depth=embedded.max_depth,
        retrain_interval_s=embedded.retrain_interval_s,
        min_samples=embedded.min_samples,
        nthread=1,  # leave the other core to the front-end: training never competes with requests for both
    )
    return EmbeddedPredictor(
        state_dir,
        store_config=StoreConfig(per_bucket=embedded.per_bucket),
        trainer_config=trainer,
        clock=clock,
        save_interval_s=embedded.save_interval_s,
        pool_shape=lambda: PoolShape.of(pool),  # read at start, after the first scrape
        registry=metrics.registry,
        max_state_age_s=embedded.max_state_age_s,
    )
