"""Flow control's Prometheus series: queue length and age per band and flow, the detector's state, outcomes
by reason, and the time requests spent queued."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from slorouter.clock import Clock
from slorouter.flowcontrol.queue import FlowQueues
from slorouter.flowcontrol.saturation import SaturationDetector
from slorouter.metrics import GENERAL_LATENCY_BUCKETS, LoopCounter, LoopHistogram


class FlowControlMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.outcomes = LoopCounter(
            "slorouter_flow_control_requests",
            "Requests leaving flow control, by priority, outcome (dispatched, evicted, expired, cancelled, "
            "rejected) and reason (the limit or rule that decided).",
            ("priority", "outcome", "reason"),
            registry=registry,
        )
        self.queued_seconds = LoopHistogram(
            "slorouter_flow_control_queue_duration_seconds",
            "Time requests spent in the flow-control queue before they left it, by priority and outcome.",
            ("priority", "outcome"),
            buckets=(0.001, *GENERAL_LATENCY_BUCKETS),
            registry=registry,
        )

    def watch(self, queues: FlowQueues, detector: SaturationDetector, clock: Clock) -> None:
        self.registry.register(_QueueCollector(queues, detector, clock.now))


class _QueueCollector(Collector):
    def __init__(self, queues: FlowQueues, detector: SaturationDetector, now: Callable[[], float]) -> None:
        self._queues = queues
        self._detector = detector
        self._now = now

    def collect(self) -> Iterator[Metric]:
        now = self._now()
        bands = GaugeMetricFamily(
            "slorouter_flow_control_queue_size", "Requests queued, by priority band.", labels=("priority",)
        )
        for priority, count in sorted(self._queues.band_counts().items()):
            bands.add_metric([str(priority)], count)
        yield bands
        yield GaugeMetricFamily(
            "slorouter_flow_control_queue_bytes", "Bytes of the queued requests.", value=self._queues.bytes
        )
        flows = GaugeMetricFamily(
            "slorouter_flow_control_flow_queue_size",
            "Requests queued, by flow (fairness id, priority); flows with nothing queued are not listed.",
            labels=("fairness_id", "priority"),
        )
        ages = GaugeMetricFamily(
            "slorouter_flow_control_flow_oldest_age_seconds",
            "Age of the oldest queued request of each flow.",
            labels=("fairness_id", "priority"),
        )
        for stats in self._queues.flow_stats():
            labels = [stats.flow.fairness_id, str(stats.flow.priority)]
            flows.add_metric(labels, stats.queued)
            ages.add_metric(labels, max(0.0, now - stats.oldest_arrival))
        yield flows
        yield ages
        yield GaugeMetricFamily(
            "slorouter_flow_control_pool_saturation",
            "Share of healthy endpoints the saturation detector sees without room (1: saturated).",
            value=self._detector.saturation(contended=len(self._queues) > 0),
        )
