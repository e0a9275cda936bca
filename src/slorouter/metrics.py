"""The router's own Prometheus metrics.

Names follow the original EPP where it has one (``inference_objective_*``), with both ``model_name`` and
``target_model_name`` filled in; slorouter-specific series are prefixed ``slorouter_``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _untyped_float_to_go_string

from slorouter.discovery.observer import DiscoveryObserver
from slorouter.pool.kv_index import KVBlockIndex
from slorouter.pool.kv_trust import TrustState
from slorouter.pool.state import MISSING_BITS, PoolState

if TYPE_CHECKING:
    from slorouter.predictor.backend import LatencyPredictorBackend

# How Prometheus formats a bucket bound ("0.005", "+Inf"); the library ships it without annotations.
_float_to_go_string = cast(Callable[[float], str], _untyped_float_to_go_string)

MODEL_LABELS = ("model_name", "target_model_name")

# Bucket sets of the original EPP (seconds).
GENERAL_LATENCY_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
    120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
TPOT_BUCKETS = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8,
    1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360,
)  # fmt: skip
SCHEDULER_BUCKETS = (
    0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
)  # fmt: skip


class HistogramSeries:
    """One label set of a ``LoopHistogram``: per-bucket counts (not cumulative) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # bucket le=b holds values ≤ b
        self.sum += value


class CounterSeries:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopHistogram(Collector):
    """A Prometheus histogram for code that runs on one event loop: ``observe`` is a bisect and two adds.

    prometheus_client's Histogram takes a lock and walks its buckets per observation, which is a visible
    share of the gateway's per-request CPU. Exposed like a Histogram (``_bucket``, ``_count``, ``_sum``),
    without the ``_created`` series. Not thread-safe: observe from the loop that serves ``/metrics``.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets if b != float("inf"))
        self._le = [_float_to_go_string(b) for b in self.bounds] + ["+Inf"]
        self._series: dict[tuple[str, ...], HistogramSeries] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> HistogramSeries:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = HistogramSeries(self.bounds)
        return series

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in list(self._series.items()):
            cumulative = 0
            buckets = []
            for le, count in zip(self._le, series.counts, strict=True):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(list(values), buckets, series.sum)
        yield family


class LoopCounter(Collector):
    """A Prometheus counter for code that runs on one event loop (see ``LoopHistogram``)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], CounterSeries] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> CounterSeries:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = CounterSeries()
        return series

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in list(self._series.items()):
            family.add_metric(list(values), series.value)
        yield family


OVERFLOW_MODEL_LABEL = "__other__"
DEFAULT_MAX_MODEL_LABEL_SETS = 256


class ModelLabelSets:
    """The (model, target model) label values the series may carry: the first ``limit`` pairs seen as they
    are, any later one as ``__other__``, counted in ``slorouter_model_label_overflow_total``. The model name
    is the client's: without a bound, one client could create series (and /metrics bytes) without end."""

    def __init__(self, registry: CollectorRegistry, limit: int = DEFAULT_MAX_MODEL_LABEL_SETS) -> None:
        self.limit = limit
        self._known: set[tuple[str, str]] = set()
        self.overflows = Counter(
            "slorouter_model_label_overflow",
            f"Requests whose model names were recorded as {OVERFLOW_MODEL_LABEL}: the label sets were full.",
            registry=registry,
        )

    def __call__(self, model: str, target_model: str) -> tuple[str, str]:
        pair = (model, target_model)
        if pair in self._known:
            return pair
        if len(self._known) < self.limit:
            self._known.add(pair)
            return pair
        self.overflows.inc()
        return OVERFLOW_MODEL_LABEL, OVERFLOW_MODEL_LABEL


class GatewayMetrics:
    """All gateway series, in a registry of their own (several gateways may share a process in tests)."""

    def __init__(
        self,
        pool: PoolState | None = None,
        registry: CollectorRegistry | None = None,
        *,
        max_model_label_sets: int = DEFAULT_MAX_MODEL_LABEL_SETS,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.model_labels = ModelLabelSets(r, max_model_label_sets)
        if pool is not None:
            r.register(PoolCollector(pool))
        # The per-request series are loop-local (no lock per update); the rare ones stay prometheus_client's.
        self.requests = LoopCounter(
            "slorouter_requests",
            "Requests answered by the gateway, by serving endpoint ('none' if not routed) and HTTP status.",
            ("endpoint", "code"),
            registry=r,
        )
        self.scheduling_duration = LoopHistogram(
            "slorouter_scheduling_duration_seconds",
            "Time to pick an endpoint (data producers, admitters and scheduler).",
            buckets=SCHEDULER_BUCKETS,
            registry=r,
        )
        self.upstream_retries = Counter(
            "slorouter_upstream_retries",
            "Requests retried on another endpoint after the first failed before any byte was sent.",
            registry=r,
        )
        self.upstream_failures = Counter(
            "slorouter_upstream_failures",
            "Upstream failures by endpoint and phase (connect, invalid, timeout, too-large: before any "
            "byte reached the client; stream: mid-response).",
            ("endpoint", "phase"),
            registry=r,
        )
        self.http_limit_rejections = LoopCounter(
            "slorouter_http_limit_rejections",
            "Client requests or connections the gateway's HTTP server turned away at a configured limit "
            "(connections, concurrent_requests, pipelined, buffered_bytes, head_bytes, target_bytes, "
            "head_timeout, body_timeout, send_timeout).",
            ("limit",),
            registry=r,
        )
        self.client_disconnects = Counter(
            "slorouter_client_disconnects", "Requests whose client went away before the end.", registry=r
        )
        self.unmatched_observations = Counter(
            "slorouter_extproc_unmatched_observations",
            "Observed responses (ext_proc observer streams) of no request this picker has in flight: routed "
            "by another picker process, or ended already.",
            registry=r,
        )
        self.unobserved_requests = Counter(
            "slorouter_extproc_unobserved_requests",
            "Requests routed for an observed response path whose observer stream never claimed them (it "
            "reached another picker process): completed as failed.",
            registry=r,
        )
        self.ttft = LoopHistogram(
            "inference_objective_request_ttft_seconds",
            "Time to first token seen by the gateway (end-to-end latency for non-streaming responses).",
            MODEL_LABELS,
            buckets=GENERAL_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = LoopHistogram(
            "inference_objective_request_tpot_seconds",
            "Mean time per output token after the first, for streaming responses.",
            MODEL_LABELS,
            buckets=TPOT_BUCKETS,
            registry=r,
        )

        # Children looked up once per label set: ``.labels()`` costs more than the increment itself.
        self._request_children: dict[tuple[str, int], Any] = {}
        self._latency_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def count_request(self, endpoint: str, code: int) -> None:
        """``slorouter_requests_total{endpoint, code}`` += 1."""
        child = self._request_children.get((endpoint, code))
        if child is None:
            child = self._request_children[(endpoint, code)] = self.requests.labels(endpoint, str(code))
        child.inc()

    def count_http_limit(self, limit: str) -> None:
        """``slorouter_http_limit_rejections_total{limit}`` += 1."""
        self.http_limit_rejections.labels(limit).inc()

    def latency_children(self, model: str, target_model: str) -> tuple[Any, Any]:
        """The (TTFT, TPOT) histogram children of one model pair."""
        children = self._latency_children.get((model, target_model))
        if children is None:
            labels = self.model_labels(model, target_model)
            children = (self.ttft.labels(*labels), self.tpot.labels(*labels))
            if labels == (model, target_model):  # an overflowing pair is not cached (it would grow the dict)
                self._latency_children[labels] = children
        return children

    def render(self) -> bytes:
        return generate_latest(self.registry)


class PoolCollector(Collector):
    """Per-endpoint pool signals, read from the pool's columns when Prometheus scrapes."""

    def __init__(self, pool: PoolState) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        series = (
            ("slorouter_endpoint_healthy", "1 if the endpoint is in the candidate set.", "healthy"),
            ("slorouter_inflight_requests", "Requests dispatched and not yet finished.", "inflight_requests"),
            (
                "slorouter_inflight_prefill_tokens",
                "Prompt tokens of in-flight requests not yet past their first token.",
                "inflight_prefill_tokens",
            ),
            (
                "slorouter_inflight_decode_tokens",
                "Context tokens of in-flight requests past their first token.",
                "inflight_decode_tokens",
            ),
            (
                "slorouter_endpoint_waiting_requests",
                "Queue depth last scraped (vllm:num_requests_waiting or its dialect's metric), or estimated "
                "from in-flight requests when the page lacks it.",
                "waiting",
            ),
            (
                "slorouter_endpoint_running_requests",
                "Running requests last scraped (vllm:num_requests_running or its dialect's metric), or "
                "estimated from in-flight requests when the page lacks it.",
                "running",
            ),
            (
                "slorouter_endpoint_kv_cache_usage",
                "KV-cache utilisation last scraped (vllm:kv_cache_usage_perc or its dialect's metric), or "
                "estimated from in-flight tokens when the page lacks it.",
                "kv_usage",
            ),
        )
        addresses = [e.address for e in self.pool.endpoints]
        for name, doc, column in series:
            family = GaugeMetricFamily(name, doc, labels=["endpoint"])
            for address, value in zip(addresses, self.pool.columns[column].tolist(), strict=True):
                family.add_metric([address], float(value))
            yield family
        dialects = GaugeMetricFamily(
            "slorouter_endpoint_metrics_dialect",
            "1 for the metric dialect the endpoint's /metrics page is read in (configured or detected).",
            labels=["endpoint", "dialect"],
        )
        missing = GaugeMetricFamily(
            "slorouter_endpoint_metric_missing",
            "1 for each load signal the endpoint's /metrics page lacks (signal: waiting, running, kv_usage; "
            "metric: what its dialect reads it from); the router's in-flight counts stand in for it.",
            labels=["endpoint", "signal", "metric"],
        )
        masks = self.pool.columns["metrics_missing"].tolist()
        for address, mask in zip(addresses, masks, strict=True):
            dialect = self.pool.metric_dialects.get(address)
            if dialect is None:
                continue
            dialects.add_metric([address, dialect.name], 1.0)
            for signal, bit in MISSING_BITS.items():
                if mask & bit:
                    missing.add_metric([address, signal, dialect.describe(signal)], 1.0)
        yield dialects
        yield missing


class KVEventsCollector(Collector):
    """Per endpoint, its KV-event stream's counters and whether the precise prefix index has its blocks."""

    _COUNTERS = (
        ("batches", "KV event batches applied."),
        ("events", "KV events applied."),
        ("gaps", "Sequence gaps seen in the KV event stream."),
        ("replays", "Sequence gaps recovered in full through the replay socket."),
        ("unrecovered", "Sequence gaps the replay could not fill (the endpoint's blocks were cleared)."),
        ("decode_errors", "KV event messages or batches that did not follow the protocol."),
        ("restarts", "Times the publisher's sequence numbers went back (its engine restarted)."),
        ("late", "Batches that came after a later one (out of order) and were skipped."),
        ("reconnects", "Subscriber sessions that failed and were reopened."),
        ("overflows", "Clears because the endpoint claimed more blocks than kv_events_max_blocks_per_pod."),
    )

    def __init__(self, index: KVBlockIndex, pool: PoolState) -> None:
        self.index = index
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        index = self.index
        addresses = [e.address for e in self.pool.endpoints]
        for key, doc in self._COUNTERS:
            counter = CounterMetricFamily(f"slorouter_kv_events_{key}", doc, labels=["endpoint"])
            for address in addresses:
                counter.add_metric([address], float(getattr(index.pod_stats(address), key)))
            yield counter
        publishing = GaugeMetricFamily(
            "slorouter_kv_events_publishing",
            "1 if the endpoint's KV events feed the precise prefix index, 0 if it falls back to the "
            "approximate index (no event received).",
            labels=["endpoint"],
        )
        blocks = GaugeMetricFamily(
            "slorouter_kv_events_blocks", "Blocks the endpoint's KV events say it holds.", labels=["endpoint"]
        )
        for address in addresses:
            publishing.add_metric([address], float(index.publishing(address)))
            blocks.add_metric([address], float(index.num_blocks(address)))
        yield publishing
        yield blocks
        silent = sum(1 for address in addresses if not index.publishing(address))
        yield GaugeMetricFamily(
            "slorouter_kv_events_silent_endpoints",
            "Endpoints from which no KV event was received.",
            value=silent,
        )
        yield from self._trust(addresses)

    def _trust(self, addresses: list[str]) -> Iterator[Metric]:
        trust = GaugeMetricFamily(
            "slorouter_kv_index_trust",
            "1 for the state the endpoint's KV-event index is in (exact, degraded, rebuilding); not exact: "
            "the precise prefix producer uses the approximate index's estimate for it.",
            labels=["endpoint", "state"],
        )
        transitions = CounterMetricFamily(
            "slorouter_kv_index_trust_transitions",
            "Changes of the endpoint's KV-event index trust, by the state entered and why.",
            labels=["endpoint", "state", "reason"],
        )
        for address in addresses:
            pod = self.index.trust.get(address)
            if pod is None:  # not subscribed
                continue
            for state in TrustState:
                trust.add_metric([address, state.value], float(pod.state is state))
            for (state, reason), count in pod.transitions.items():
                transitions.add_metric([address, state.value, reason.value], float(count))
        yield trust
        yield transitions


# Actual latency over the served prediction of the chosen pod: the share at or below 1.0 is the prediction's
# coverage (0.9 for a well-calibrated p90 model); the spread around it is its error.
PREDICTION_RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
PREDICTION_DURATION_BUCKETS = (
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5,
)  # fmt: skip


class LatencyMetrics:
    """Series of the predicted-latency pipeline (names after the original EPP, labels filled in)."""

    def __init__(self, registry: CollectorRegistry, model_labels: ModelLabelSets | None = None) -> None:
        r = registry
        # Shared with the gateway's series when both are in one registry (one bound, one overflow counter).
        self.model_labels = model_labels if model_labels is not None else ModelLabelSets(r)
        self.predicted_ttft = Histogram(
            "inference_objective_request_predicted_ttft_seconds",
            "Predicted TTFT of the chosen endpoint (E2E latency when streamingMode is false).",
            MODEL_LABELS,
            buckets=GENERAL_LATENCY_BUCKETS,
            registry=r,
        )
        self.predicted_tpot = Histogram(
            "inference_objective_request_predicted_tpot_seconds",
            "Predicted TPOT of the chosen endpoint (streamingMode true).",
            MODEL_LABELS,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.prediction_duration = Histogram(
            "inference_objective_request_prediction_duration_seconds",
            "Wall time of one batched TTFT+TPOT prediction over the candidates.",
            MODEL_LABELS,
            buckets=PREDICTION_DURATION_BUCKETS,
            registry=r,
        )
        self.prediction_ratio = Histogram(
            "slorouter_prediction_actual_over_predicted",
            "Actual TTFT (E2E when streamingMode is false) or TPOT of a request over the prediction served "
            "for its pod; the share at or below 1 is the prediction's coverage.",
            ("model",),
            buckets=PREDICTION_RATIO_BUCKETS,
            registry=r,
        )
        self.coverage_factor = Gauge(
            "slorouter_prediction_coverage_factor",
            "The live-coverage factor in every served prediction of this kind (predicted-latency-producer's "
            "coverageStep): above 1 when the models' calibrated quantile covered less in live traffic.",
            ("model",),
            registry=r,
        )
        self.ttft_slo_violations = Counter(
            "inference_objective_request_ttft_slo_violation",
            "Requests whose actual TTFT (E2E when streamingMode is false) exceeded x-slo-ttft-ms.",
            MODEL_LABELS,
            registry=r,
        )
        self.tpot_slo_violations = Counter(
            "inference_objective_request_tpot_slo_violation",
            "Requests whose actual TPOT exceeded x-slo-tpot-ms.",
            MODEL_LABELS,
            registry=r,
        )
        self.fallbacks = Counter(
            "slorouter_prediction_fallbacks",
            "Requests that wanted prediction but were routed without it, by reason.",
            ("reason",),
            registry=r,
        )
        self.shed = Counter(
            "slorouter_requests_shed",
            "Sheddable requests rejected because no endpoint was predicted to meet their SLO.",
            MODEL_LABELS,
            registry=r,
        )
        self.explorations = Counter(
            "slorouter_scheduling_explorations",
            "Requests routed by an epsilon-greedy exploration instead of the exploit path.",
            registry=r,
        )
        self.producer_skips = Counter(
            "slorouter_data_producer_skips",
            "Data producers that scheduling went on without: still waiting (or not started) when the "
            "producers' time budget ran out.",
            ("producer",),
            registry=r,
        )
        self.training_samples = Counter(
            "slorouter_training_samples",
            "Training samples recorded from completed requests, by model.",
            ("model",),
            registry=r,
        )


TTFT_REGRET_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
AVOIDABLE_PREFILL_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536)
REGRET_LABELS = ("profile", "reason")


class RegretMetrics:
    """Routing regret (``audit.regret``), by the primary profile and the pick's reason (``PickReason``).
    Loop-local: observe from the loop that serves ``/metrics``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.achieved = LoopCounter(
            "slorouter_routing_prefix_tokens_achieved",
            "Prompt tokens the chosen endpoint held in its prefix cache at the pick.",
            REGRET_LABELS,
            registry=r,
        )
        self.reachable = LoopCounter(
            "slorouter_routing_prefix_tokens_reachable",
            "The most prompt tokens any candidate held in its prefix cache at the pick.",
            REGRET_LABELS,
            registry=r,
        )
        self.avoidable = LoopHistogram(
            "slorouter_routing_avoidable_prefill_tokens",
            "Per pick, reachable minus achieved prefix tokens: the prefill the choice cost (_count: picks).",
            REGRET_LABELS,
            buckets=AVOIDABLE_PREFILL_BUCKETS,
            registry=r,
        )
        self.ttft_regret = LoopHistogram(
            "slorouter_routing_ttft_regret_seconds",
            "Per pick with TTFT estimates, the chosen endpoint's expected TTFT minus the best candidate's.",
            REGRET_LABELS,
            buckets=TTFT_REGRET_BUCKETS,
            registry=r,
        )


class PredictorCollector(Collector):
    """Predictor readiness and, where the backend knows them, the model versions it serves."""

    def __init__(self, backend: LatencyPredictorBackend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        ready = GaugeMetricFamily("slorouter_predictor_ready", "1 when a trained model serves predictions.")
        ready.add_metric([], float(bool(self.backend.ready)))
        yield ready
        versions = self.backend.versions
        if versions:
            info = GaugeMetricFamily(
                "slorouter_predictor_model_info", "The model version served, per model (value 1).",
                labels=["model", "version"],
            )  # fmt: skip
            for kind, version in sorted(versions.items()):
                if version:
                    info.add_metric([kind, version], 1.0)
            yield info


class DiscoveryMetrics(DiscoveryObserver):
    """Series of Kubernetes pool discovery (``pool.kubernetes``), from what it reports; ``resource`` is
    ``pods`` or ``inferencepools``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.pods = Gauge(
            "slorouter_discovery_pods",
            "Pods the selector matches, by state (serving, not_ready, pending: no IP yet, terminating).",
            ("state",),
            registry=r,
        )
        self.endpoints = Gauge(
            "slorouter_discovery_endpoints",
            "Pool endpoints from discovery (serving pods x target ports).",
            registry=r,
        )
        self.endpoint_changes = Counter(
            "slorouter_discovery_endpoint_changes",
            "Endpoints discovery added to or removed from the pool (change: added, removed).",
            ("change",),
            registry=r,
        )
        self.watch_events = Counter(
            "slorouter_discovery_watch_events",
            "Watch events received, by resource and type (ADDED, MODIFIED, DELETED, BOOKMARK).",
            ("resource", "type"),
            registry=r,
        )
        self.lists = Counter(
            "slorouter_discovery_lists",
            "Lists sent, by resource and result (ok, error).",
            ("resource", "result"),
            registry=r,
        )
        self.watch_restarts = Counter(
            "slorouter_discovery_watch_restarts",
            "Watches that ended and were restarted, by resource and reason (ended: closed by the API server "
            "on time, resumed; expired: 410 Gone, relisted; error: failed or cut, resumed after a pause).",
            ("resource", "reason"),
            registry=r,
        )
        self.malformed_objects = Counter(
            "slorouter_discovery_malformed_objects",
            "Objects left out because they do not have the documented shape, by resource.",
            ("resource",),
            registry=r,
        )
        self.last_sync = Gauge(
            "slorouter_discovery_last_sync_timestamp_seconds",
            "Unix time of the API server's last answer that brought discovery up to date (a list, a watch "
            "event or bookmark, a watch ended on time), by resource; now minus this is the sync lag bound.",
            ("resource",),
            registry=r,
        )
        self.inference_pool_changes = Counter(
            "slorouter_discovery_inference_pool_changes",
            "Changes of the followed InferencePool (change: appeared, selector, target_ports, gone).",
            ("change",),
            registry=r,
        )
        self.kv_subscriptions = Gauge(
            "slorouter_discovery_kv_event_subscriptions",
            "Discovered endpoints with a KV-event subscriber.",
            registry=r,
        )
        self.kv_events_config_errors = Counter(
            "slorouter_discovery_kv_events_config_errors",
            "Pods whose KV-event settings could not be used (served without KV events), by the annotation "
            "at fault (or pool.kubernetes.kv_events).",
            ("source",),
            registry=r,
        )

    def listed(self, resource: str, ok: bool) -> None:
        self.lists.labels(resource, "ok" if ok else "error").inc()

    def watch_event(self, resource: str, event_type: str) -> None:
        self.watch_events.labels(resource, event_type).inc()

    def watch_restarted(self, resource: str, reason: str) -> None:
        self.watch_restarts.labels(resource, reason).inc()

    def synced(self, resource: str) -> None:
        self.last_sync.labels(resource).set_to_current_time()

    def malformed(self, resource: str) -> None:
        self.malformed_objects.labels(resource).inc()

    def membership(self, added: int, removed: int, endpoints: int, pods: Mapping[str, int]) -> None:
        if added:
            self.endpoint_changes.labels("added").inc(added)
        if removed:
            self.endpoint_changes.labels("removed").inc(removed)
        self.endpoints.set(endpoints)
        for state, count in pods.items():
            self.pods.labels(state).set(count)

    def inference_pool_changed(self, change: str) -> None:
        self.inference_pool_changes.labels(change).inc()

    def kv_event_subscriptions(self, count: int) -> None:
        self.kv_subscriptions.set(count)

    def kv_events_config_error(self, source: str) -> None:
        self.kv_events_config_errors.labels(source).inc()
