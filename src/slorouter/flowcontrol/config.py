"""The ``flowControl`` section of the router's YAML (the original's shape where it has one), and the
controller it builds."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from slorouter.clock import Clock
from slorouter.flowcontrol.controller import FlowController, LanePick
from slorouter.flowcontrol.metrics import FlowControlMetrics
from slorouter.flowcontrol.policies import fairness_policy
from slorouter.flowcontrol.queue import FlowQueues
from slorouter.flowcontrol.saturation import SaturationDetector, SaturationThresholds
from slorouter.flowcontrol.types import Limits
from slorouter.pool.state import PoolState
from slorouter.validation import StrictModel

FAIRNESS_ID_HEADER = "x-llm-d-inference-fairness-id"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$")


def _seconds(value: object) -> object:
    """``30``, ``"30s"``, ``"500ms"``, ``"2m"`` → seconds (Go-style durations, as the original's)."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"{value!r} is not a duration (e.g. 30, '30s', '500ms', '2m')")
        number, unit = float(match.group(1)), match.group(2) or "s"
        return number * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]
    return value


class _CamelModel(StrictModel):
    model_config = ConfigDict(populate_by_name=False)


class BandLimitsConfig(_CamelModel):
    max_requests: int | None = Field(default=None, ge=1, alias="maxRequests")
    max_bytes: int | None = Field(default=None, ge=1, alias="maxBytes")

    def limits(self) -> Limits:
        return Limits(self.max_requests, self.max_bytes)


class PriorityBandConfig(BandLimitsConfig):
    priority: int


class SaturationDetectorConfig(_CamelModel):
    queue_depth_threshold: int = Field(
        default=5, ge=0, alias="queueDepthThreshold", description="engine queue an endpoint may hold"
    )
    queued_queue_depth_threshold: int | None = Field(
        default=1,
        ge=0,
        alias="queuedQueueDepthThreshold",
        description="engine queue an endpoint may hold while requests wait in the router; null: "
        "queueDepthThreshold",
    )
    kv_cache_util_threshold: float = Field(default=0.8, gt=0, le=1, alias="kvCacheUtilThreshold")
    max_inflight_requests: int | None = Field(
        default=None,
        ge=1,
        alias="maxInflightRequestsPerEndpoint",
        description="default: the endpoint's learned batch-slot cap + queueDepthThreshold",
    )
    max_inflight_prefill_tokens: int | None = Field(
        default=None,
        ge=1,
        alias="maxInflightPrefillTokensPerEndpoint",
        description="default: the endpoint's learned prefill rate × prefillTargetTime",
    )
    prefill_target_s: float | None = Field(
        default=0.1,
        gt=0,
        alias="prefillTargetTime",
        description="the derived prefill bound's time; null: no derived bound",
    )

    queued_prefill_target_s: float | None = Field(
        default=0.02,
        gt=0,
        alias="queuedPrefillTargetTime",
        description="the derived prefill bound's time while requests wait in the router; null: "
        "prefillTargetTime",
    )

    _durations = field_validator("prefill_target_s", "queued_prefill_target_s", mode="before")(
        classmethod(lambda cls, value: _seconds(value))
    )

    def thresholds(self, lane: PriorityLaneConfig | None = None) -> SaturationThresholds:
        return SaturationThresholds(
            queue_depth_threshold=self.queue_depth_threshold,
            kv_cache_util_threshold=self.kv_cache_util_threshold,
            max_inflight_requests=self.max_inflight_requests,
            max_inflight_prefill_tokens=self.max_inflight_prefill_tokens,
            prefill_target_s=self.prefill_target_s,
            queued_prefill_target_s=self.queued_prefill_target_s,
            lane_kv_cache_util_threshold=(lane or PriorityLaneConfig()).kv_cache_util_threshold,
            queued_queue_depth_threshold=self.queued_queue_depth_threshold,
        )


class PriorityLaneConfig(_CamelModel):
    min_priority: int | None = Field(
        default=1,
        alias="minPriority",
        description="requests of this priority or higher form the lane; null: no lane",
    )
    kv_cache_util_threshold: float = Field(default=0.9, gt=0, le=1, alias="kvCacheUtilThreshold")
    pick: LanePick = Field(default=LanePick.SCHEDULER)


class FlowControlConfig(_CamelModel):
    enabled: bool | None = Field(
        default=None,
        description="null (the default): on with the built-in predicted-latency pipeline, off otherwise",
    )
    max_requests: int | None = Field(default=None, ge=1, alias="maxRequests")
    max_bytes: int | None = Field(default=1 << 30, ge=1, alias="maxBytes")
    default_request_ttl_s: float | None = Field(
        default=30.0, gt=0, alias="defaultRequestTTL", description="null: requests never expire"
    )
    fairness_policy: Literal["round-robin", "program-aware-fairness"] = Field(
        default="round-robin", alias="fairnessPolicy"
    )
    fairness_half_life_s: float = Field(default=60.0, gt=0, alias="fairnessHalfLife")
    ordering_policy: Literal["fcfs", "slo-deadline"] = Field(default="fcfs", alias="orderingPolicy")
    fairness_id_header: str = Field(default=FAIRNESS_ID_HEADER, min_length=1, alias="fairnessIdHeader")
    priority_bands: list[PriorityBandConfig] = Field(default_factory=list, alias="priorityBands")
    default_priority_band: BandLimitsConfig = Field(
        default_factory=BandLimitsConfig, alias="defaultPriorityBand"
    )
    saturation_detector: SaturationDetectorConfig = Field(
        default_factory=SaturationDetectorConfig, alias="saturationDetector"
    )
    priority_lane: PriorityLaneConfig = Field(default_factory=PriorityLaneConfig, alias="priorityLane")
    poll_interval_s: float = Field(default=0.02, gt=0, alias="pollInterval")

    _durations = field_validator(
        "default_request_ttl_s", "fairness_half_life_s", "poll_interval_s", mode="before"
    )(classmethod(lambda cls, value: _seconds(value)))

    @field_validator("fairness_id_header")
    @classmethod
    def _lower_header(cls, value: str) -> str:
        return value.lower()

    @model_validator(mode="after")
    def _unique_bands(self) -> FlowControlConfig:
        seen: set[int] = set()
        for i, band in enumerate(self.priority_bands):
            if band.priority in seen:
                raise ValueError(f"priorityBands[{i}]: priority {band.priority} is listed twice")
            seen.add(band.priority)
        return self

    def build(
        self, pool: PoolState, clock: Clock, metrics: FlowControlMetrics | None = None
    ) -> FlowController:
        policy, half_life = self.fairness_policy, self.fairness_half_life_s
        queues = FlowQueues(
            fairness=lambda: fairness_policy(policy, half_life),
            ordering=self.ordering_policy,
            limits=Limits(self.max_requests, self.max_bytes),
            band_limits={band.priority: band.limits() for band in self.priority_bands},
            default_band_limits=self.default_priority_band.limits(),
        )
        lane = self.priority_lane
        detector = SaturationDetector(pool, self.saturation_detector.thresholds(lane))
        return FlowController(
            queues,
            detector,
            clock,
            poll_interval_s=self.poll_interval_s,
            request_ttl_s=self.default_request_ttl_s,
            fairness_header=self.fairness_id_header,
            metrics=metrics,
            lane_min_priority=lane.min_priority,
            lane_pick=lane.pick,
        )
