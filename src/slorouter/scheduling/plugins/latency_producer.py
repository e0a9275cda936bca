"""``predicted-latency-producer``: predictions before the pick, training samples after the response.

Before scheduling it builds one feature row per candidate from the freshest pool state (scraped metrics,
router-local in-flight counts, prefix match) and the request, gets TTFT and TPOT predictions for all
candidates in one batched call, and attaches predictions, headroom and validity (see ``latency.py``). After
the response it records training samples with the very feature row that was used to predict for the chosen
endpoint, so training and prediction never disagree about what a feature meant.

- ``streamingMode: false`` (default): one TTFT-model sample per request holding its end-to-end latency.
- ``streamingMode: true``: a TTFT sample at the first token and a TPOT sample at the end,
  TPOT = (E2E − TTFT) / (output tokens − 1), from token counts (``usage`` when the server sends it).

Live coverage (``coverageStep``, on by default): the models' predictions are quantiles (p90 by default,
``coverageQuantile``), calibrated on samples of the training window; a ``CoverageTracker`` scales the chosen
pod's prediction as served (headers, metrics) by a factor moved after every outcome, so that it covers that
share of live requests too. Routing (tiers, admission, scorers) keeps the models' quantile.

Mixed pools: with ``podClassLabel`` the endpoint label's value becomes the ``pod_class`` feature (the model
must be trained with that schema). Without it, an online per-endpoint correction (``endpointCorrection``)
learns how much slower or faster each endpoint runs than predicted and scales its predictions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from slorouter.predictor.backend import PredictionUnavailable
from slorouter.predictor.correction import EndpointCorrection
from slorouter.predictor.coverage import CoverageTracker
from slorouter.predictor.features import (
    DEFAULT_SCHEMA,
    FeatureSchema,
    ModelKind,
    columns_to_union_matrix,
    pod_class_code,
)
from slorouter.predictor.ledger import NO_OBJECTIVE
from slorouter.scheduling.datakeys import (
    PREDICTED_TPOT_MS,
    PREDICTED_TTFT_MS,
    PREFIX_MATCH_BLOCKS,
    TPOT_HEADROOM_MS,
    TPOT_VALID,
    TTFT_HEADROOM_MS,
    TTFT_VALID,
)
from slorouter.scheduling.plugin import (
    DataProducer,
    LatencyPredicting,
    Plugin,
    PluginContext,
    PluginParams,
    PreRequest,
    PreRequestResult,
    ResponseBodyProcessor,
    ResponseInfo,
    TargetPrediction,
    Termination,
)
from slorouter.scheduling.prefix_blocks import prefix_match_ratio
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import Candidates, InferenceRequest, SchedulingResult

log = logging.getLogger(__name__)


def compute_headroom(
    predicted_ttft_ms: np.ndarray,
    predicted_tpot_ms: np.ndarray,
    *,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    streaming_mode: bool,
    slo_buffer_factor: float = 1.0,
    ttft_slo_buffer_factor: float = 1.0,
    strictest_running_tpot_slo_ms: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Headroom (SLO − prediction, ms) and validity per candidate, as the producer attaches them.

    Without any SLO the request wants the fastest pod: TTFT headroom is −prediction (every pod "misses",
    which sends the scorer to its lowest-deficit ordering) and, in streaming mode, so is TPOT headroom.
    With an SLO on one dimension only, the other dimension is unconstrained (valid, headroom 0) — the
    original treats the missing header as an SLO of 0 there, which makes every pod invalid.
    The TTFT budget is ``slo · ttftSloBufferFactor``: below 1 it asks the served (p90) prediction to leave a
    margin, which makes "predicted to meet" stricter than the prediction's own coverage.
    Outside streaming mode TPOT is not modelled, so it is always valid with headroom 0. In streaming mode the
    TPOT budget is ``slo · sloBufferFactor``, tightened to the strictest TPOT SLO of the requests already
    running on that pod (entries ≤ 0 mean none), so a new request does not push co-located ones over theirs.
    """
    n = len(predicted_ttft_ms)
    has_slo = slo_ttft_ms is not None or slo_tpot_ms is not None
    if slo_ttft_ms is not None:
        ttft_budget = slo_ttft_ms * ttft_slo_buffer_factor
        ttft_headroom = ttft_budget - predicted_ttft_ms
        ttft_valid = predicted_ttft_ms < ttft_budget
    elif has_slo:
        ttft_headroom, ttft_valid = np.zeros(n), np.ones(n, dtype=bool)
    else:
        ttft_headroom, ttft_valid = -predicted_ttft_ms, np.zeros(n, dtype=bool)

    if not streaming_mode:
        tpot_headroom, tpot_valid = np.zeros(n), np.ones(n, dtype=bool)
    elif slo_tpot_ms is not None:
        budget = np.full(n, slo_tpot_ms * slo_buffer_factor)
        if strictest_running_tpot_slo_ms is not None:
            strictest = strictest_running_tpot_slo_ms * slo_buffer_factor
            budget = np.where(strictest > 0, np.minimum(budget, strictest), budget)
        tpot_headroom = budget - predicted_tpot_ms
        tpot_valid = predicted_tpot_ms < budget
    elif has_slo:
        tpot_headroom, tpot_valid = np.zeros(n), np.ones(n, dtype=bool)
    else:
        tpot_headroom, tpot_valid = -predicted_tpot_ms, np.zeros(n, dtype=bool)
    return {
        TTFT_HEADROOM_MS: np.asarray(ttft_headroom, dtype=np.float64),
        TPOT_HEADROOM_MS: np.asarray(tpot_headroom, dtype=np.float64),
        TTFT_VALID: ttft_valid,
        TPOT_VALID: tpot_valid,
    }


class PredictedLatencyParams(PluginParams):
    streaming_mode: bool = Field(False, alias="streamingMode")
    slo_buffer_factor: float = Field(1.0, alias="sloBufferFactor", gt=0.0)
    ttft_slo_buffer_factor: float = Field(1.0, alias="ttftSloBufferFactor", gt=0.0)
    predict_in_produce: bool = Field(True, alias="predictInProduce")
    pod_class_label: str = Field("", alias="podClassLabel")
    endpoint_correction: bool = Field(True, alias="endpointCorrection")
    # 0 turns live-coverage tracking off; the quantile is the one the models serve (the predictor's).
    coverage_step: float = Field(0.01, alias="coverageStep", ge=0.0, le=0.5, allow_inf_nan=False)
    coverage_quantile: float = Field(0.9, alias="coverageQuantile", gt=0.0, lt=1.0)


@dataclass(slots=True)
class _RequestState:
    """What the producer remembers about one request between produce, pre-request and the response."""

    addresses: list[str]
    x_all: np.ndarray  # one row per candidate over both models' features (``schema.all_features()``)
    ttft_columns: slice | list[int]  # where each model's features sit in x_all
    tpot_columns: slice | list[int]
    predicted_ttft: np.ndarray | None = None  # uncorrected model output, per candidate
    predicted_tpot: np.ndarray | None = None
    corrected_ttft: np.ndarray | None = None
    corrected_tpot: np.ndarray | None = None
    ttft_coverage_factor: float = 1.0
    tpot_coverage_factor: float = 1.0
    target: int = -1
    target_address: str = ""
    tpot_slo_registered: bool = False
    samples: list[str] = field(default_factory=list)


@register_plugin
class PredictedLatencyProducer(Plugin, DataProducer, PreRequest, ResponseBodyProcessor, LatencyPredicting):
    type_name = "predicted-latency-producer"
    Params = PredictedLatencyParams
    params: PredictedLatencyParams
    produces = (
        PREDICTED_TTFT_MS,
        PREDICTED_TPOT_MS,
        TTFT_HEADROOM_MS,
        TPOT_HEADROOM_MS,
        TTFT_VALID,
        TPOT_VALID,
    )
    consumes = (PREFIX_MATCH_BLOCKS,)

    def __init__(self, name: str, params: PluginParams, ctx: PluginContext) -> None:
        super().__init__(name, params, ctx)
        self.schema = FeatureSchema(DEFAULT_SCHEMA.version, pod_class=bool(self.params.pod_class_label))
        self._ttft_columns = self.schema.union_columns("ttft")
        self._tpot_columns = self.schema.union_columns("tpot")
        use_correction = self.params.endpoint_correction and not self.params.pod_class_label
        self.correction = EndpointCorrection() if use_correction else None
        p = self.params
        self.coverage = (
            CoverageTracker(p.coverage_quantile, step=p.coverage_step) if p.coverage_step > 0 else None
        )
        # TPOT SLOs of the requests running on each endpoint (streaming mode): the strictest is protected.
        self._running_tpot_slos: dict[str, Counter[float]] = {}
        self._served = False  # whether the predictor has been ready at least once

    @property
    def predicts_end_to_end(self) -> bool:
        return not self.params.streaming_mode

    # --- produce -------------------------------------------------------------------------------------
    def produce(self, request: InferenceRequest, candidates: Candidates) -> Awaitable[None] | None:
        columns: dict[str, np.ndarray | float] = {
            "kv_cache_percentage": candidates.column("kv_usage"),
            "input_token_length": float(request.prompt_tokens),
            "num_request_waiting": candidates.column("waiting"),
            "num_request_running": candidates.column("running"),
            "prefill_tokens_in_flight": candidates.column("inflight_prefill_tokens"),
            "decode_tokens_in_flight": candidates.column("inflight_decode_tokens"),
            "prefix_cache_score": prefix_match_ratio(candidates),
            "num_tokens_generated": float(request.max_tokens),
        }
        if self.schema.pod_class:
            label = self.params.pod_class_label
            columns["pod_class"] = np.array(
                [float(pod_class_code(e.labels.get(label))) for e in candidates.endpoints]
            )
        state = _RequestState(
            addresses=[e.address for e in candidates.endpoints],
            x_all=columns_to_union_matrix(columns, schema=self.schema),
            ttft_columns=self._ttft_columns,
            tpot_columns=self._tpot_columns,
        )
        request.state[self.name] = state
        backend = self.ctx.predictor
        if backend is None or not self.params.predict_in_produce or not request.use_prediction:
            return None
        if not backend.ready:
            # Before the first model this is the warm-up; after it, the predictor went away (e.g. every
            # prediction server is down), which operators need to tell apart.
            self._fallback(request, "unavailable" if self._served else "warming-up")
            return None
        self._served = True
        if not backend.synchronous:
            return self._produce_remote(request, candidates, state)
        started = time.perf_counter()
        try:
            ttft, tpot = backend.predict_now(state.x_all)
        except PredictionUnavailable as exc:
            self._fallback(request, "unavailable", exc)
            return None
        self._attach(request, candidates, state, ttft, tpot, time.perf_counter() - started)
        return None

    async def _produce_remote(
        self, request: InferenceRequest, candidates: Candidates, state: _RequestState
    ) -> None:
        assert self.ctx.predictor is not None
        started = time.perf_counter()
        try:
            ttft, tpot = await self.ctx.predictor.predict(state.x_all)
        except PredictionUnavailable as exc:
            self._fallback(request, "unavailable", exc)
            return
        except asyncio.CancelledError:
            # The director's data-producer budget ran out first (a remote timeout_ms longer than
            # dataProducerTimeoutMs): the request goes without a prediction, and must say so.
            self._fallback(request, "unavailable", PredictionUnavailable("cancelled", "timeout"))
            raise
        self._attach(request, candidates, state, ttft, tpot, time.perf_counter() - started)

    def _attach(
        self,
        request: InferenceRequest,
        candidates: Candidates,
        state: _RequestState,
        ttft: np.ndarray,
        tpot: np.ndarray,
        duration_s: float,
    ) -> None:
        ttft = np.asarray(ttft, dtype=np.float64)
        tpot = np.asarray(tpot, dtype=np.float64)
        if len(ttft) != len(candidates) or not np.isfinite(ttft).all():
            self._fallback(request, "invalid-prediction")
            return
        # No TPOT model yet (it needs finished requests): TPOT is unknown, not zero, so no TPOT SLO can be
        # judged; treat it as unconstrained until the model exists.
        tpot = np.where(np.isfinite(tpot), tpot, 0.0)
        state.predicted_ttft, state.predicted_tpot = ttft, tpot
        if self.correction is not None:
            ttft = ttft * self.correction.factors(state.addresses, "ttft")
            if self.params.streaming_mode:
                tpot = tpot * self.correction.factors(state.addresses, "tpot")
        state.corrected_ttft, state.corrected_tpot = ttft, tpot
        if self.coverage is not None:
            # Served to the client and checked against its outcome; the routing below (tiers, admission,
            # scorers) keeps the models' own calibrated quantile: with the factor in it the TTFT tiers were
            # stricter and cost SLO attainment at 75 % load (docs/design/live-coverage.md).
            state.ttft_coverage_factor = self.coverage.factor("ttft")
            if self.params.streaming_mode:
                state.tpot_coverage_factor = self.coverage.factor("tpot")
        ledger = self.ctx.ledger
        if ledger is not None and ledger.distrusts(state.addresses):
            # Kept for the ledger, which judges the model on the outcomes it predicted, but not routed by.
            self._fallback(request, "drift")
            return
        strictest = None
        if self.params.streaming_mode and self._running_tpot_slos:
            running = self._running_tpot_slos
            strictest = np.array([min(running.get(a, ()), default=0.0) for a in state.addresses])
        candidates.attrs[PREDICTED_TTFT_MS] = ttft
        candidates.attrs[PREDICTED_TPOT_MS] = tpot
        candidates.attrs.update(
            compute_headroom(
                ttft,
                tpot,
                slo_ttft_ms=request.slo_ttft_ms,
                slo_tpot_ms=request.slo_tpot_ms,
                streaming_mode=self.params.streaming_mode,
                slo_buffer_factor=self.params.slo_buffer_factor,
                ttft_slo_buffer_factor=self.params.ttft_slo_buffer_factor,
                strictest_running_tpot_slo_ms=strictest,
            )
        )
        metrics = self.ctx.metrics
        if metrics is not None:
            labels = metrics.model_labels(request.model, request.target_model)
            metrics.prediction_duration.labels(*labels).observe(duration_s)

    def _fallback(
        self, request: InferenceRequest, reason: str, exc: PredictionUnavailable | None = None
    ) -> None:
        # The request keeps the backend's own word for the cause (breaker-open, timeout, ...: the
        # x-slorouter-fallback-reason header); the metric keeps the three coarse reasons.
        request.prediction_unavailable = exc.reason if exc is not None else reason
        if exc is not None:
            log.debug("prediction unavailable (%s): %s", exc.reason, exc)
        if self.ctx.metrics is not None:
            self.ctx.metrics.fallbacks.labels(reason).inc()

    # --- pre-request ---------------------------------------------------------------------------------
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> PreRequestResult | None:
        state: _RequestState | None = request.state.get(self.name)
        if state is None:
            return None
        address = result.target.address
        state.target_address = address
        try:
            state.target = state.addresses.index(address)
        except ValueError:
            return None
        prediction = served_ttft = served_tpot = None
        if request.prediction_unavailable is None:  # a fallback's predictions (distrusted) are not served
            served_ttft = self._served_prediction(state, "ttft")
            served_tpot = self._served_prediction(state, "tpot")
        if served_ttft is not None and state.corrected_tpot is not None:
            prediction = TargetPrediction(
                served_ttft,
                served_tpot,
                ttft_coverage_factor=state.ttft_coverage_factor,
                tpot_coverage_factor=state.tpot_coverage_factor,
            )
        if served_ttft is not None and self.ctx.metrics is not None:
            labels = self.ctx.metrics.model_labels(request.model, request.target_model)
            self.ctx.metrics.predicted_ttft.labels(*labels).observe(served_ttft / 1000)
            if served_tpot is not None:
                self.ctx.metrics.predicted_tpot.labels(*labels).observe(served_tpot / 1000)
        if self.params.streaming_mode and request.slo_tpot_ms is not None:
            self._running_tpot_slos.setdefault(address, Counter())[request.slo_tpot_ms] += 1
            state.tpot_slo_registered = True
        return None if prediction is None else PreRequestResult(prediction=prediction)

    # --- response ------------------------------------------------------------------------------------
    def on_response_body(
        self, request: InferenceRequest, response: ResponseInfo, *, start_of_stream: bool, end_of_stream: bool
    ) -> None:
        state: _RequestState | None = request.state.get(self.name)
        if state is None:
            return
        if response.endpoint.address != state.target_address and state.target_address:
            self._follow(request, state, response.endpoint.address)
        if state.target < 0:
            return
        ok = not response.failed and response.status in (0, 200)
        streaming = self.params.streaming_mode
        if streaming and start_of_stream and ok and response.first_token_at is not None and not end_of_stream:
            self._record(request, state, "ttft", (response.first_token_at - response.dispatched_at) * 1000)
        if not end_of_stream:
            return
        self._release_tpot_slo(request, state)
        if response.cause is Termination.CANCELLED:
            self._censored(request, state, response)
            return
        if not ok or response.completed_at is None:
            return
        e2e_ms = (response.completed_at - response.dispatched_at) * 1000
        if not streaming:
            self._record(request, state, "ttft", e2e_ms)
            return
        if response.first_token_at is None:
            return
        ttft_ms = (response.first_token_at - response.dispatched_at) * 1000
        if "ttft" not in state.samples:  # the first token and the end came together
            self._record(request, state, "ttft", ttft_ms)
        if response.tokens > 1:
            self._record(request, state, "tpot", (e2e_ms - ttft_ms) / (response.tokens - 1))

    def _censored(self, request: InferenceRequest, state: _RequestState, response: ResponseInfo) -> None:
        """The router cancelled the request. Before its first token (its deadline passed, or its hedged copy
        answered first) its TTFT is only known to be above the time it waited. Dropping it would teach the
        model that the slowest requests never happen; so the wait is recorded as the sample when it is above
        the prediction (a lower bound that still corrects the model), and dropped when it says nothing. A
        stream cut for its TPOT trains the TPOT it had."""
        if response.completed_at is None:
            return
        first = response.first_token_at
        if first is not None:  # a stream cut for its TPOT: the tokens it had came at the pace observed
            if self.params.streaming_mode and response.tokens > 1:
                tpot_ms = (response.completed_at - first) * 1000 / (response.tokens - 1)
                self._record(request, state, "tpot", tpot_ms, count_slo=False)
            return
        predicted = state.predicted_ttft
        if predicted is None:
            return
        waited_ms = (response.completed_at - response.dispatched_at) * 1000
        if waited_ms > float(predicted[state.target]):
            # Not an SLO violation of its own: the front-end that cancelled it counts those.
            self._record(request, state, "ttft", waited_ms, count_slo=False)

    def _record(
        self,
        request: InferenceRequest,
        state: _RequestState,
        kind: ModelKind,
        latency_ms: float,
        *,
        count_slo: bool = True,
    ) -> None:
        if kind in state.samples or not latency_ms > 0:
            return
        state.samples.append(kind)
        i = state.target
        row = state.x_all[i, state.ttft_columns if kind == "ttft" else state.tpot_columns]
        backend = self.ctx.predictor
        if backend is not None:
            try:
                backend.add_sample(kind, row, latency_ms)
            except Exception:
                log.exception("recording a %s training sample failed", kind)
        predicted = state.predicted_ttft if kind == "ttft" else state.predicted_tpot
        if self.correction is not None and predicted is not None and predicted[i] > 0:
            self.correction.observe(state.target_address, kind, float(predicted[i]), latency_ms)
        served = self._served_prediction(state, kind)
        if served is not None and served > 0 and self.coverage is not None:
            self.coverage.observe(kind, latency_ms, served)
        ledger = self.ctx.ledger
        if ledger is not None and count_slo:  # not a cancelled request's wait: a lower bound, not an outcome
            routed = state.corrected_ttft if kind == "ttft" else state.corrected_tpot
            if routed is not None and (kind == "ttft" or self.params.streaming_mode):
                ledger.add(
                    state.target_address,
                    request.objective or NO_OBJECTIVE,
                    kind,
                    float(routed[i]),
                    latency_ms,
                    served,
                )
        metrics = self.ctx.metrics
        if metrics is None:
            return
        metrics.training_samples.labels(kind).inc()
        if served is not None and served > 0:
            metrics.prediction_ratio.labels(kind).observe(latency_ms / served)
            if self.coverage is not None:
                metrics.coverage_factor.labels(kind).set(self.coverage.factor(kind))
        if not count_slo:
            return
        labels = (request.model, request.target_model)
        if kind == "ttft" and request.slo_ttft_ms is not None and latency_ms > request.slo_ttft_ms:
            metrics.ttft_slo_violations.labels(*labels).inc()
        if kind == "tpot" and request.slo_tpot_ms is not None and latency_ms > request.slo_tpot_ms:
            metrics.tpot_slo_violations.labels(*labels).inc()

    def _served_prediction(self, state: _RequestState, kind: ModelKind) -> float | None:
        """The prediction served for the chosen pod (the live-coverage factor included); None if there was
        none (no prediction, or TPOT outside streaming mode)."""
        corrected = state.corrected_ttft if kind == "ttft" else state.corrected_tpot
        if corrected is None or state.target < 0 or (kind == "tpot" and not self.params.streaming_mode):
            return None
        factor = state.ttft_coverage_factor if kind == "ttft" else state.tpot_coverage_factor
        return float(corrected[state.target]) * factor

    def _follow(self, request: InferenceRequest, state: _RequestState, address: str) -> None:
        """The request was served by another candidate than the pick (a data-plane retry): its samples are
        that candidate's row, predicted at the same time, and its TPOT SLO runs there."""
        registered = state.tpot_slo_registered
        self._release_tpot_slo(request, state)
        state.target_address = address
        state.target = state.addresses.index(address) if address in state.addresses else -1
        if registered and request.slo_tpot_ms is not None:
            self._running_tpot_slos.setdefault(address, Counter())[request.slo_tpot_ms] += 1
            state.tpot_slo_registered = True

    def _release_tpot_slo(self, request: InferenceRequest, state: _RequestState) -> None:
        if not state.tpot_slo_registered or request.slo_tpot_ms is None:
            return
        state.tpot_slo_registered = False
        slos = self._running_tpot_slos.get(state.target_address)
        if slos is None:
            return
        slos[request.slo_tpot_ms] -= 1
        if slos[request.slo_tpot_ms] <= 0:
            del slos[request.slo_tpot_ms]
        if not slos:
            del self._running_tpot_slos[state.target_address]
