"""The router's status page, ``GET /v1/router/status`` on both front-ends (the gateway's port, the picker's
metrics port): what the router knows of its pool and of its picks, as one typed JSON document.

``/metrics`` already carries the counters (requests by code, sheds, SLO violations); this page adds what
Prometheus series do not hold, or hold only as histograms: per endpoint the latest scraped load, the
router's own in-flight count, its share of the picks, and the TTFT it was predicted and the TTFT it
delivered over its last requests; the routes taken, the share of requests with an SLO that met it, and the
predictor's state. ``slorouter top`` reads it. ``RouterStats`` collects the per-request part, fed by every
front-end's ``OutcomeRecorder``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import msgspec

from slorouter.clock import Clock
from slorouter.pool.kv_trust import TrustReason, TrustState, TrustView
from slorouter.pool.state import PoolState
from slorouter.predictor.backend import LatencyPredictorBackend
from slorouter.predictor.features import ModelKind
from slorouter.predictor.ledger import Accuracy, LedgerSummary
from slorouter.predictor.warm_start import WarmStartReport
from slorouter.serving.regret import RegretStatus

STATUS_PATH = "/v1/router/status"
STATUS_SCHEMA = "slorouter.router-status/v1"
# Each endpoint's predicted and observed TTFT are means over its last WINDOW successful requests.
WINDOW = 64


class KVIndexStatus(msgspec.Struct, frozen=True, kw_only=True):
    """How far the endpoint's KV-event index is trusted (``slorouter.pool.kv_trust``)."""

    state: TrustState
    reason: TrustReason  # none when exact
    for_s: float  # in this state (and for this reason) since this long


class EndpointStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One endpoint of the pool."""

    address: str
    healthy: bool
    inflight_requests: int  # dispatched by this router and not finished
    waiting: int  # last scraped queue (vllm:num_requests_waiting)
    running: int  # last scraped vllm:num_requests_running
    kv_usage: float  # last scraped KV-cache utilisation, 0..1
    metrics_age_s: float | None  # since the last successful scrape; None: never scraped
    picks: int  # finished requests this router sent here, since it started
    # Over the endpoint's last ``window`` successful requests: the mean TTFT predicted for those that had a
    # prediction (E2E latency when the predictor models it), and the mean TTFT observed on the same requests
    # (on all of them when none had a prediction: heuristic routing).
    predicted_ttft_ms: float | None
    observed_ttft_ms: float | None
    kv_index: KVIndexStatus | None = None  # None: the router does not subscribe to its KV events


class SloStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Finished requests that carried an SLO (x-slo-ttft-ms, x-slo-tpot-ms), and those that met all of it; a
    failed request did not."""

    requests: int
    met: int

    @property
    def attainment(self) -> float | None:
        return self.met / self.requests if self.requests else None


class PredictorStatus(msgspec.Struct, frozen=True, kw_only=True):
    mode: str  # embedded, remote, off
    ready: bool  # a trained model serves predictions
    # Model version per kind: served (embedded), or published by the training server (remote).
    versions: dict[str, str | None]
    # What the embedded predictor took over at start, refused, and how the live checks went; None without a
    # state directory and for the remote predictor (its training server's /v1/status has it).
    warm_start: WarmStartReport | None = None
    # Remote: prediction servers serving other versions than the published ones for too long, and theirs.
    stale_servers: dict[str, dict[str, str]] = msgspec.field(default_factory=dict)


class AccuracyStatus(msgspec.Struct, frozen=True, kw_only=True):
    """How one endpoint's or objective's predictions of one kind met their outcomes (``predictor.ledger``)."""

    outcomes: int
    coverage: float  # share of outcomes at or under the predicted quantile routing used
    mape: float | None  # of the point predictions; None where the predictor does not give them (remote)
    bias: float | None  # median point prediction over outcome, minus 1: > 0, predictions run high


class LedgerStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The prediction ledger over its window: per endpoint and per objective, per model kind (ttft, tpot)."""

    window_s: float
    quantile: float  # the models' quantile: the coverage to expect
    endpoints: dict[str, dict[str, AccuracyStatus]]
    objectives: dict[str, dict[str, AccuracyStatus]]
    drifting: dict[str, list[str]]  # endpoint → the kinds whose predictions drift there now
    drifts: int  # drifts that began since the start
    distrusted: list[str] = msgspec.field(default_factory=list)  # routed by heuristics while they drift

    @classmethod
    def of(cls, summary: LedgerSummary) -> LedgerStatus:
        def groups(by: Mapping[str, Mapping[ModelKind, Accuracy]]) -> dict[str, dict[str, AccuracyStatus]]:
            return {
                name: {
                    kind: AccuracyStatus(outcomes=a.outcomes, coverage=a.coverage, mape=a.mape, bias=a.bias)
                    for kind, a in kinds.items()
                }
                for name, kinds in by.items()
            }

        return cls(
            window_s=summary.window_s,
            quantile=summary.quantile,
            endpoints=groups(summary.endpoints),
            objectives=groups(summary.objectives),
            drifting={endpoint: list(kinds) for endpoint, kinds in summary.drifting.items()},
            drifts=summary.drifts,
            distrusted=summary.distrusted,
        )


class TuningStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The status page's ``tuning`` section."""

    active: str
    candidates: list[str]
    rounds: int
    switches: int
    worker: str  # "running", "starting", "not started" (and why), or "down: " and why
    last_round_age_s: float | None = None
    last_round: dict[str, Any] | None = None  # the tuner's summary of its last answered round


class ObjectiveActionsStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What one objective's deadline did: hedges by outcome, hedges not sent (why), cancellations by SLO."""

    action: str  # cancel, hedge
    hedges: dict[str, int]  # sent, won, lost, failed, cancelled
    hedges_skipped: dict[str, int]  # budget, saturated, no-endpoint
    cancelled: dict[str, int]  # ttft, tpot
    stall_hedges: int = 0  # hedges sent at once because the request's endpoint had stalled


class SloActionsStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Deadlines and hedges (``objectives.NAME.deadline``)."""

    objectives: dict[str, ObjectiveActionsStatus]
    hedge_budget: float  # hedges the budget holds now
    loser_prefill_tokens: int  # prompt tokens sent to the copies that lost a hedge


class RouterStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The whole page."""

    schema: str  # STATUS_SCHEMA
    front_end: str  # gateway, picker
    uptime_s: float
    window: int  # requests behind each endpoint's predicted and observed TTFT
    requests: int  # finished requests (dispatched to an endpoint)
    routes: dict[str, int]  # finished requests by route (heuristic, predicted, explore, fallback)
    slo: SloStatus
    predictor: PredictorStatus
    queued: int | None  # requests held by flow control now; None: flow control is off
    endpoints: list[EndpointStatus]
    tuning: TuningStatus | None = None  # None: the router does not tune itself
    deadlines: SloActionsStatus | None = None  # None: no objective has a deadline
    ledger: LedgerStatus | None = None  # None: no predictor
    regret: RegretStatus | None = None  # None: audit.regret is off


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(RouterStatus)


def encode_status(status: RouterStatus) -> bytes:
    return _ENCODER.encode(status)


class NotAStatusPageError(ValueError):
    """The body is not a router status page of this version."""


def decode_status(body: bytes) -> RouterStatus:
    """The page's ``RouterStatus``; raises ``NotAStatusPageError`` for anything else."""
    try:
        status = _DECODER.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise NotAStatusPageError(f"not a slorouter status page ({exc})") from None
    if status.schema != STATUS_SCHEMA:
        raise NotAStatusPageError(f"status schema {status.schema!r}, expected {STATUS_SCHEMA!r}")
    return status


class _EndpointStats:
    __slots__ = ("picks", "ttft")

    def __init__(self, window: int) -> None:
        self.picks = 0
        self.ttft: deque[tuple[float | None, float]] = deque(maxlen=window)  # (predicted, observed) ms

    def means(self) -> tuple[float | None, float | None]:
        """(mean predicted, mean observed) TTFT: see ``EndpointStatus``."""
        paired = [(p, o) for p, o in self.ttft if p is not None]
        if paired:
            return sum(p for p, _ in paired) / len(paired), sum(o for _, o in paired) / len(paired)
        if self.ttft:
            return None, sum(o for _, o in self.ttft) / len(self.ttft)
        return None, None


class RouterStats:
    """What the front-ends saw of their finished requests, for the status page. Loop-local, like the
    front-ends' metrics: record from the loop that serves the page."""

    def __init__(self, clock: Clock, window: int = WINDOW) -> None:
        self.clock = clock
        self.window = window
        self.started_at = clock.now()
        self.requests = 0
        self.routes: dict[str, int] = {}
        self.slo_requests = 0
        self.slo_met = 0
        self._endpoints: dict[str, _EndpointStats] = {}

    def record(
        self,
        address: str,
        route: str,
        *,
        predicted_ttft_ms: float | None,
        observed_ttft_ms: float | None,
        slo_met: bool | None,
    ) -> None:
        """One finished request: served by ``address``; ``observed_ttft_ms`` None when it failed;
        ``slo_met`` None when it carried no SLO."""
        self.requests += 1
        self.routes[route] = self.routes.get(route, 0) + 1
        stats = self._endpoints.get(address)
        if stats is None:
            stats = self._endpoints[address] = _EndpointStats(self.window)
        stats.picks += 1
        if observed_ttft_ms is not None:
            if predicted_ttft_ms is not None and not math.isfinite(predicted_ttft_ms):
                predicted_ttft_ms = None
            stats.ttft.append((predicted_ttft_ms, observed_ttft_ms))
        if slo_met is not None:
            self.slo_requests += 1
            self.slo_met += slo_met

    def status(
        self,
        front_end: str,
        pool: PoolState,
        *,
        predictor_mode: str,
        predictor: LatencyPredictorBackend | None,
        queued: int | None,
        tuning: TuningStatus | None = None,
        deadlines: SloActionsStatus | None = None,
        ledger: LedgerStatus | None = None,
        kv_trust: Mapping[str, TrustView] | None = None,
        regret: RegretStatus | None = None,
    ) -> RouterStatus:
        """The page now: the pool's current endpoints (an endpoint that left is no longer shown);
        ``kv_trust``: the KV-event trust of the subscribed endpoints, on the same clock."""
        now = self.clock.now()
        columns = {
            name: pool.columns[name].tolist()
            for name in ("healthy", "inflight_requests", "waiting", "running", "kv_usage", "metrics_time")
        }
        endpoints = []
        for i, endpoint in enumerate(pool.endpoints):
            stats = self._endpoints.get(endpoint.address) or _EndpointStats(0)
            scraped = columns["metrics_time"][i]
            predicted, observed = stats.means()
            trust = None if kv_trust is None else kv_trust.get(endpoint.address)
            endpoints.append(
                EndpointStatus(
                    address=endpoint.address,
                    healthy=bool(columns["healthy"][i]),
                    inflight_requests=int(columns["inflight_requests"][i]),
                    waiting=int(columns["waiting"][i]),
                    running=int(columns["running"][i]),
                    kv_usage=float(columns["kv_usage"][i]),
                    metrics_age_s=max(0.0, now - scraped) if math.isfinite(scraped) else None,
                    picks=stats.picks,
                    predicted_ttft_ms=predicted,
                    observed_ttft_ms=observed,
                    kv_index=None
                    if trust is None
                    else KVIndexStatus(
                        state=trust.state, reason=trust.reason, for_s=max(0.0, now - trust.since)
                    ),
                )
            )
        versions: Mapping[str, str | None] = predictor.versions if predictor is not None else {}
        return RouterStatus(
            schema=STATUS_SCHEMA,
            front_end=front_end,
            uptime_s=max(0.0, now - self.started_at),
            window=self.window,
            requests=self.requests,
            routes=dict(self.routes),
            slo=SloStatus(requests=self.slo_requests, met=self.slo_met),
            predictor=PredictorStatus(
                mode=predictor_mode if predictor is not None else "off",
                ready=bool(predictor is not None and predictor.ready),
                versions=dict(versions),
                warm_start=None if predictor is None else predictor.warm_start_report,
                stale_servers={}
                if predictor is None
                else {url: dict(v) for url, v in predictor.stale_servers.items()},
            ),
            queued=queued,
            endpoints=endpoints,
            tuning=tuning,
            deadlines=deadlines,
            ledger=ledger,
            regret=regret,
        )
