"""``load-latency-producer``: the expected TTFT (and the own prefill's stall, the decode pace) on every
candidate, from the router's load counters and the online fit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field

from slorouter.scheduling.datakeys import (
    DECODE_PACE_MS,
    EXPECTED_TTFT_MS,
    INFLIGHT_PREFILL_TOKENS,
    OWN_PREFILL_MS,
    PREFIX_BLOCK_SIZE_TOKENS,
    PREFIX_MATCH_BLOCKS,
    PREFIX_TOTAL_BLOCKS,
)
from slorouter.scheduling.plugin import (
    DataProducer,
    Plugin,
    PluginContext,
    PluginParams,
    PreRequest,
    PreRequestResult,
    ResponseBodyProcessor,
    ResponseInfo,
)
from slorouter.scheduling.plugins.load_latency.fit import LoadLatencyFit
from slorouter.scheduling.plugins.load_latency.pace import DecodePace
from slorouter.scheduling.plugins.load_latency.slots import BatchSlotQueue
from slorouter.scheduling.plugins.load_latency.terms import DECODE_SCALE, WORK_SCALE, load_terms
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.token_load import uncached_prompt_tokens
from slorouter.scheduling.types import Candidates, InferenceRequest, SchedulingResult

PRUNE_EVERY = 1024  # schedulings between drops of the per-pod state of pods no longer in the pool


class LoadLatencyParams(PluginParams):
    half_life_samples: float = Field(2000.0, alias="halfLifeSamples", gt=0.0)
    speed_half_life_samples: float = Field(64.0, alias="speedHalfLifeSamples", gt=0.0)
    speed_prior_samples: float = Field(16.0, alias="speedPriorSamples", ge=0.0)
    min_samples: int = Field(50, alias="minSamples", ge=1)
    pace_half_life_streams: float = Field(8.0, alias="paceHalfLifeStreams", gt=0.0, allow_inf_nan=False)


@dataclass(slots=True)
class _Dispatch:
    pods: list[str]
    terms: np.ndarray
    target: int = -1
    observed: bool = False


@register_plugin(default_producer=True)
class LoadLatencyProducer(Plugin, DataProducer, PreRequest, ResponseBodyProcessor):
    """Attaches ``expected_ttft_ms`` per candidate (module docstring) and learns from the first tokens."""

    type_name = "load-latency-producer"
    Params = LoadLatencyParams
    params: LoadLatencyParams
    produces = (EXPECTED_TTFT_MS, OWN_PREFILL_MS, DECODE_PACE_MS)
    consumes = (INFLIGHT_PREFILL_TOKENS, PREFIX_MATCH_BLOCKS, PREFIX_TOTAL_BLOCKS, PREFIX_BLOCK_SIZE_TOKENS)

    def __init__(self, name: str, params: PluginParams, ctx: PluginContext) -> None:
        super().__init__(name, params, ctx)
        p = self.params
        self.fit = LoadLatencyFit(
            half_life_samples=p.half_life_samples,
            speed_half_life_samples=p.speed_half_life_samples,
            speed_prior_samples=p.speed_prior_samples,
            min_samples=p.min_samples,
        )
        self.slots = BatchSlotQueue()
        self.pace = DecodePace(half_life_streams=p.pace_half_life_streams)
        self._until_prune = PRUNE_EVERY

    def forget_departed(self) -> None:
        """Drops the speeds and slot state of pods that left the pool (a pool whose pods come and go, as
        Kubernetes pods do with new addresses, would otherwise grow them without bound)."""
        pool = self.ctx.pool
        if pool is None:
            return
        known = self.fit.speeds.pods() | self.slots.pods() | self.pace.pods()
        for pod in known - {e.address for e in pool.endpoints}:
            self.fit.forget(pod)
            self.slots.forget(pod)
            self.pace.forget(pod)

    def produce(self, request: InferenceRequest, candidates: Candidates) -> None:
        self._until_prune -= 1
        if self._until_prune <= 0:
            self._until_prune = PRUNE_EVERY
            self.forget_departed()
        own = uncached_prompt_tokens(request, candidates)
        decode = candidates.column("inflight_decode_tokens")
        inflight = candidates.column("inflight_requests")
        waiting = inflight - candidates.column("inflight_decoding")
        pods = [e.address for e in candidates.endpoints]
        self.slots.learn_caps(pods, candidates.column("waiting"), candidates.column("running"))
        slot_wait = self.slots.wait_ms(pods, inflight)
        terms = load_terms(candidates.column("inflight_prefill_tokens"), own, decode, waiting, slot_wait)
        request.state[self.name] = _Dispatch(pods, terms)
        theta = self.fit.theta
        if theta is None:
            return
        fixed_speed, work_speed = self.fit.speeds.arrays(pods)
        candidates.attrs[EXPECTED_TTFT_MS] = self.fit.expected_with(theta, terms, fixed_speed, work_speed)
        # What the request's own prompt adds to the pod's work: the terms in o.
        o = own * WORK_SCALE
        per_own_token = theta[2] + theta[4] * (decode * DECODE_SCALE) + theta[5] * o
        candidates.attrs[OWN_PREFILL_MS] = per_own_token * o * work_speed
        candidates.attrs[DECODE_PACE_MS] = self.pace.of(pods)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> PreRequestResult | None:
        dispatch: _Dispatch | None = request.state.get(self.name)
        if dispatch is not None:
            try:
                dispatch.target = dispatch.pods.index(result.target.address)
            except ValueError:
                dispatch.target = -1
        return None

    def on_response_body(
        self, request: InferenceRequest, response: ResponseInfo, *, start_of_stream: bool, end_of_stream: bool
    ) -> None:
        dispatch: _Dispatch | None = request.state.get(self.name)
        if dispatch is None or dispatch.target < 0 or response.first_token_at is None:
            return
        if response.failed or response.status not in (0, 200):
            return
        if end_of_stream and response.completed_at is not None:
            pod = dispatch.pods[dispatch.target]
            service_ms = (response.completed_at - response.dispatched_at) * 1000.0
            self.slots.observe_service(pod, service_ms)
            if response.streaming:
                self.pace.observe(pod, response.first_token_at, response.completed_at, response.tokens)
        if dispatch.observed:
            return
        dispatch.observed = True
        i = dispatch.target
        ttft_ms = (response.first_token_at - response.dispatched_at) * 1000.0
        self.fit.observe(dispatch.pods[i], dispatch.terms[i], ttft_ms)
