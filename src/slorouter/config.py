"""The ``slorouter serve`` configuration file: YAML → validated objects, with errors that name the key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, model_validator

from slorouter.flowcontrol.config import FlowControlConfig
from slorouter.http.auth import check_token_text, read_token_env, read_token_file
from slorouter.pool.config import PoolConfig
from slorouter.predictor.state_dir import DEFAULT_MAX_AGE_S
from slorouter.tracing.config import TracingConfig
from slorouter.validation import StrictModel, format_validation_error
from slorouter.yamlfile import YAMLFileError, load_yaml_mapping


class ConfigError(ValueError):
    """A configuration problem, with a message that names the offending key."""


class GatewayConfig(StrictModel):
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, description="larger bodies get 413")
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="if any key is set, Authorization: Bearer KEY is checked"
    )
    api_keys_file: str | None = Field(
        default=None, min_length=1, description="more keys: a file of one key a line (# comments)"
    )
    api_keys_env: str | None = Field(
        default=None,
        min_length=1,
        description="more keys: the environment variable of this name, comma-separated",
    )
    connect_timeout_s: float = Field(default=5.0, gt=0)
    upstream_timeout_s: float = Field(default=600.0, gt=0, description="whole upstream response")
    upstream_first_byte_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="request sent → the upstream's first response byte (a JSON answer's comes when it is "
        "whole); then 504",
    )
    upstream_idle_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="longest pause between the upstream's response bytes; then 504, or mid-stream an error "
        "event",
    )
    max_upstream_body_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="a non-streamed upstream answer larger gets 502"
    )
    retry_on_upstream_failure: bool = True
    request_head_timeout_s: float = Field(
        default=10.0, gt=0, description="a request head must be whole this long after its first byte (408)"
    )
    request_body_timeout_s: float = Field(
        default=30.0, gt=0, description="longest pause between bytes of a request body (408)"
    )
    keepalive_timeout_s: float = Field(default=75.0, gt=0, description="idle client connections are closed")
    max_model_label_sets: int = Field(
        default=256, ge=1, description="distinct (model, target model) label pairs; later ones are __other__"
    )
    shutdown_drain_timeout_s: float = Field(
        default=30.0, ge=0, description="on SIGTERM: how long the requests in progress may still run"
    )
    send_timeout_s: float = Field(
        default=60.0, gt=0, description="a client that reads nothing of its answer this long is disconnected"
    )
    max_connections: int = Field(default=4096, ge=1, description="client connections beyond it get 503")
    max_buffered_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1024,
        description="request-body bytes held across all client connections; beyond it 503",
    )
    max_header_bytes: int = Field(
        default=64 * 1024, ge=1024, description="request line and header fields of one request; beyond it 431"
    )
    max_header_fields: int = Field(
        default=200, ge=8, description="header fields of one request; beyond it 431"
    )
    max_request_target_bytes: int = Field(
        default=8 * 1024, ge=256, description="the request target (path and query); beyond it 414"
    )
    max_pipelined_requests: int = Field(
        default=64, ge=1, description="requests read on one connection ahead of its answers; beyond it 503"
    )
    max_concurrent_requests: int | None = Field(
        default=None,
        ge=1,
        description="inference and model-list requests handled at once; beyond it 503. Default: derived "
        "from the pool (256 per endpoint, twice that with flow control)",
    )
    _accepted_keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _read_api_keys(self) -> GatewayConfig:
        # Read once, at load: a file or variable that cannot give keys stops the start-up, naming it (never
        # a key). The keys are SecretStr or private, so no dump, repr or error message shows them.
        keys = [key.get_secret_value() for key in self.api_keys]
        for i, key in enumerate(keys):
            problem = check_token_text(key)
            if problem is not None:
                raise ValueError(f"api_keys[{i}]: the key {problem}")
        if self.api_keys_file is not None:
            try:
                keys += read_token_file(str(Path(self.api_keys_file).expanduser()))
            except ValueError as exc:
                raise ValueError(f"api_keys_file: {exc}") from None
        if self.api_keys_env is not None:
            try:
                keys += read_token_env(self.api_keys_env, os.environ)
            except ValueError as exc:
                raise ValueError(f"api_keys_env: {exc}") from None
        self._accepted_keys = tuple(dict.fromkeys(keys))
        return self

    @property
    def accepted_api_keys(self) -> tuple[str, ...]:
        """Every key of ``api_keys``, ``api_keys_file`` and ``api_keys_env``; empty: no key is checked."""
        return self._accepted_keys


class EmbeddedPredictorConfig(StrictModel):
    """Store, trainer and predictor inside the router (no sidecars)."""

    persist: bool = Field(
        default=True, description="keep models and samples in state_dir across restarts; false: a temp dir"
    )
    state_dir: str | None = Field(
        default=None,
        min_length=1,
        description="models and sample window; default <state>/slorouter/serve/<key> (epp: .../epp/<key>), "
        "<state> $XDG_STATE_HOME or ~/.local/state, <key> the config file's name and a hash of its path",
    )
    save_interval_s: float = Field(default=60.0, gt=0, description="how often the sample window is saved")
    max_state_age_s: float | None = Field(
        default=DEFAULT_MAX_AGE_S,
        gt=0,
        description="saved models and a sample window older than this are refused at start (reason stale); "
        "null: no limit",
    )
    retrain_interval_s: float = Field(default=5.0, gt=0)
    min_samples: int = Field(default=200, ge=10)
    objective: Literal["conformal", "quantile", "mean"] = "conformal"
    quantile: float = Field(default=0.9, gt=0, lt=1)
    n_estimators: int = Field(default=200, ge=1, le=5000)
    max_depth: int = Field(default=6, ge=1, le=16)
    per_bucket: int = Field(default=500, ge=1, description="newest samples kept per stratified bucket")

    @model_validator(mode="after")
    def _state_dir_needs_persist(self) -> EmbeddedPredictorConfig:
        if self.state_dir is not None and not self.persist:
            raise ValueError("state_dir is set but persist is false (nothing would be kept there)")
        return self


class PredictionBreakerConfig(StrictModel):
    """The prediction client's circuit breaker (docs/reliability.md, "Predictor faults")."""

    failures: int = Field(default=5, ge=1, description="consecutive failed exchanges that open it")
    latency_budget_ms: float | None = Field(
        default=None,
        gt=0,
        description="p99 latency of the recent exchanges above this opens it; default: timeout_ms (then it "
        "opens when over 1% of the exchanges time out)",
    )
    window: int = Field(default=100, ge=1, le=100_000, description="recent exchanges the p99 is taken over")
    cooldown_s: float = Field(default=1.0, gt=0, description="open this long before one probe call")
    max_cooldown_s: float = Field(
        default=10.0, gt=0, description="the cool-down doubles after each failed probe, up to this"
    )

    @model_validator(mode="after")
    def _cooldowns_ordered(self) -> PredictionBreakerConfig:
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError(
                f"max_cooldown_s ({self.max_cooldown_s:g}) must be at least cooldown_s ({self.cooldown_s:g})"
            )
        return self


class RemotePredictorConfig(StrictModel):
    """Sidecar mode: a training server and one or more prediction servers."""

    training_server: str = Field(min_length=1, description="URL of the training server")
    prediction_servers: list[str] = Field(min_length=1, description="URLs of the prediction servers")
    timeout_ms: float = Field(default=50.0, gt=0, description="after this, route by the heuristic fallback")
    coalesce_window_ms: float = Field(default=1.0, ge=0)
    flush_interval_s: float = Field(default=1.0, gt=0)
    max_buffered_samples: int = Field(default=50_000, ge=1)
    token_file: str | None = Field(
        default=None,
        min_length=1,
        description="the predictor servers' token (their --token-file): sent as Authorization: Bearer",
    )
    token_env: str | None = Field(
        default=None, min_length=1, description="or the environment variable of this name holds it"
    )
    breaker: PredictionBreakerConfig = Field(default_factory=PredictionBreakerConfig)
    stale_after_s: float = Field(
        default=30.0,
        gt=0,
        description="a prediction server serving other model versions than the training server publishes "
        "for this long is stale: predictions go to the others while any is ready",
    )
    _tokens: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _read_token(self) -> RemotePredictorConfig:
        if self.token_file is not None and self.token_env is not None:
            raise ValueError("give token_file or token_env, not both")
        try:
            if self.token_file is not None:
                self._tokens = tuple(read_token_file(str(Path(self.token_file).expanduser())))
            elif self.token_env is not None:
                self._tokens = tuple(read_token_env(self.token_env, os.environ))
        except ValueError as exc:
            raise ValueError(f"{'token_file' if self.token_file else 'token_env'}: {exc}") from None
        return self

    @property
    def tokens(self) -> tuple[str, ...]:
        """The predictor servers' tokens (the first is sent); empty: none is sent."""
        return self._tokens


class LedgerConfig(StrictModel):
    """The prediction ledger: each routed request's prediction paired with its outcome, and drift."""

    enabled: bool = Field(default=True, description="keep the ledger (false: no figures, drift or fallback)")
    window_s: float = Field(default=60.0, gt=0, description="outcomes older than this leave the figures")
    max_entries: int = Field(
        default=20_000, ge=100, le=1_000_000, description="at most this many outcomes kept"
    )
    coverage_band: tuple[float, float] = Field(
        default=(0.5, 1.0),
        description="an endpoint whose predicted quantile covers a share of its outcomes outside this band "
        "is out of band (the default judges under-prediction only: predictions uniformly too high still "
        "rank the endpoints)",
    )
    drift_after_s: float = Field(default=30.0, gt=0, description="out of band this long: drifting")
    fallback_after_s: float | None = Field(
        default=None,
        ge=0,
        description="drifting this long (after the retrain it asked for), its served predictions out of band "
        "too: requests with the endpoint among their candidates are routed by the heuristic profile until "
        "it is back in band; null (the default): a drift never changes routing "
        "(docs/design/ledger-fallback.md)",
    )
    min_outcomes: int = Field(
        default=30, ge=1, description="an endpoint is judged once its window holds this many"
    )

    @model_validator(mode="after")
    def _band_ordered(self) -> LedgerConfig:
        low, high = self.coverage_band
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(
                f"coverage_band must be [low, high] with 0 <= low < high <= 1, got [{low}, {high}]"
            )
        return self


class PredictorConfig(StrictModel):
    mode: Literal["embedded", "remote", "off"] = "embedded"
    prediction_by_default: bool = Field(
        default=False,
        description="route every request by prediction unless it sends x-prediction-based-scheduling: false",
    )
    embedded: EmbeddedPredictorConfig = Field(default_factory=EmbeddedPredictorConfig)
    remote: RemotePredictorConfig | None = None
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)

    @model_validator(mode="after")
    def _remote_needs_urls(self) -> PredictorConfig:
        if self.mode == "remote" and self.remote is None:
            raise ValueError("mode 'remote' needs predictor.remote.training_server and prediction_servers")
        return self


class DeadlineConfig(StrictModel):
    """What the router does when a request of the objective overruns its SLO after the pick
    (docs/configuration.md, "Deadlines and hedged requests")."""

    action: Literal["none", "cancel", "hedge"] = Field(
        default="none",
        description="none: wait; cancel (sheddable objectives): end the request and free its slot; hedge "
        "(other objectives): send a copy to the best other endpoint when no token came by the hedge delay",
    )
    ttft_factor: float = Field(
        default=1.0, gt=0, description="cancel: the deadline is the request's TTFT SLO times this"
    )
    tpot: bool = Field(
        default=False, description="cancel: also when a stream's running TPOT stays above its TPOT SLO"
    )
    tpot_factor: float = Field(default=1.0, gt=0, description="the TPOT deadline: the TPOT SLO times this")
    tpot_min_tokens: int = Field(
        default=16, ge=2, description="a stream's running TPOT is judged from this many tokens on"
    )


# The engines take a 64-bit priority (vLLM bounds its field so); vLLM's is the negation of the router's.
ENGINE_PRIORITY_LIMIT = 2**63 - 1


class ObjectiveConfig(StrictModel):
    priority: int = Field(default=0, description="< 0 makes the objective's requests sheddable")
    deadline: DeadlineConfig = Field(default_factory=DeadlineConfig)
    engine_priority: int | None = Field(
        default=None,
        strict=True,
        ge=-ENGINE_PRIORITY_LIMIT,
        le=ENGINE_PRIORITY_LIMIT,
        description="the priority sent to the model servers (pool.engine_priority), in the sense of "
        "priority (higher runs first); default: priority",
    )

    @property
    def engine_value(self) -> int:
        """The priority the model servers get for this objective, higher first (before the engine's form)."""
        return self.priority if self.engine_priority is None else self.engine_priority

    @model_validator(mode="after")
    def _action_fits_priority(self) -> ObjectiveConfig:
        action = self.deadline.action
        if action == "cancel" and self.priority >= 0:
            raise ValueError(
                f"deadline.action cancel is for sheddable objectives (priority < 0); this one has priority "
                f"{self.priority}: use hedge, or make it sheddable"
            )
        if action == "hedge" and self.priority < 0:
            raise ValueError(
                f"deadline.action hedge is for objectives that are not sheddable; this one has priority "
                f"{self.priority}: use cancel"
            )
        return self


class HedgingConfig(StrictModel):
    """When and how often the router hedges the requests of objectives with ``deadline.action: hedge``."""

    max_share: float = Field(
        default=0.2, ge=0, le=1, description="at most this share of the hedgeable requests is hedged"
    )
    burst: float = Field(default=10.0, ge=1, description="hedges the budget holds for a burst of slow pods")
    delay_factor: float = Field(
        default=1.5,
        gt=0,
        description="the hedge delay: the chosen endpoint's predicted TTFT times this ...",
    )
    max_slo_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="without a prediction, hedge this share of the TTFT SLO after the arrival; none: a "
        "request without a prediction is hedged only when its endpoint stalls",
    )
    max_delay_slo_factor: float | None = Field(
        default=None,
        gt=0,
        description="with a prediction, at the latest the TTFT SLO times this (hedges slow long prompts too, "
        "at a prefill cost); none: no such cap",
    )
    min_delay_ms: float = Field(default=20.0, ge=0, description="never earlier than this")
    stall_ms: float | None = Field(
        default=500.0,
        gt=0,
        description="an endpoint with requests decoding that produced no token for this long, and for "
        "stall_step_factor times the longest step it took lately, is stalled: the requests that wait there "
        "for a first token are hedged at once (checked every half of stall_ms while they wait), and no copy "
        "goes to it; none: no such check",
    )
    stall_step_factor: float = Field(
        default=2.5,
        ge=1,
        description="a stall is a silence this many times the endpoint's longest recent step",
    )
    overdue_factor: float | None = Field(
        default=1.0,
        ge=0,
        description="with predictions, the copy goes out only once the request is overdue (past its own "
        "predicted TTFT) by the copy's predicted TTFT times this: a copy that would answer after the "
        "original is not sent; none: whenever the hedge is due",
    )
    min_slo_share: float | None = Field(
        default=None,
        gt=0,
        description="never before this share of the TTFT SLO after the arrival (a request still well within "
        "its SLO is not hedged); none: no such floor",
    )


class TuningGuardConfig(StrictModel):
    """The check after each switch: back to the previous candidate at once when TTFT p90 collapses."""

    period_s: float = Field(default=10.0, gt=0, description="how often, and over how much traffic, it checks")
    watch_s: float = Field(default=60.0, gt=0, description="how long after a switch it watches")
    ratio: float = Field(
        default=1.5, gt=1, description="TTFT p90 above this many times the period before the switch: go back"
    )

    @model_validator(mode="after")
    def _watch_covers_a_period(self) -> TuningGuardConfig:
        if self.watch_s < self.period_s:
            raise ValueError(f"watch_s ({self.watch_s}) must be at least period_s ({self.period_s})")
        return self


class TuningConfig(StrictModel):
    """The router tunes its own pipeline: a twin of the pool replays its recent traffic under each candidate
    of the scheduler's ``candidate-profile-handler`` (docs/self-tuning.md)."""

    enabled: bool = Field(default=False, description="run the tuner (a child process at low priority)")
    interval_s: float = Field(default=180.0, gt=0, description="between rounds")
    window_s: float = Field(default=120.0, gt=0, description="the recent traffic each round replays")
    warmup_share: float = Field(default=0.25, ge=0, lt=1, description="replays measure after this share")
    candidates: list[str] = Field(default_factory=list, description="the candidates compared; empty: all")
    max_twin_error: float = Field(
        default=0.25, ge=0, description="the twin is trusted only within this relative error"
    )
    min_gain: float = Field(default=0.03, ge=0, description="smallest TTFT p90 gain worth a switch")
    tolerance: float = Field(
        default=0.02, ge=0, description="how much worse TTFT p99, TPOT p50 or SLO attainment may be"
    )
    min_requests: int = Field(default=100, ge=1, description="fewer in the window: no round")
    min_span_s: float = Field(
        default=60.0,
        ge=0,
        description="no round before the router has seen this much traffic (its cold start)",
    )
    max_requests: int = Field(default=4000, ge=1, description="more: the most recent ones")
    untrusted_rounds: int = Field(
        default=2, ge=1, description="rounds in a row with an untrusted twin before going back to the start"
    )
    cpu_budget: float = Field(
        default=0.25, gt=0, le=1, description="share of one core the tuner may use, over its rounds"
    )
    round_timeout_s: float = Field(
        default=600.0, gt=0, description="a round not answered by then is abandoned"
    )
    guard: TuningGuardConfig = Field(default_factory=TuningGuardConfig)


MAX_SCORES_HEADER_CANDIDATES = 64


class AuditConfig(StrictModel):
    """Routing decisions an operator can audit (docs/routing-audit.md): off by default, and a request pays
    nothing for it while both are off."""

    regret: bool = Field(
        default=False,
        description="record each pick: routing regret by profile and reason on /metrics and the status page",
    )
    scores_header: bool = Field(
        default=False,
        description="each candidate's score, expected TTFT and cached prefix, and the runner-up, in the "
        "x-slorouter-scores response header, the request's span and (picker) Envoy's dynamic metadata",
    )
    scores_max_candidates: int = Field(
        default=8,
        ge=2,
        le=MAX_SCORES_HEADER_CANDIDATES,
        description="candidates in the scores header: the chosen one, the runner-up, then the best-scored; "
        "the rest are cut (x-slorouter-scores-omitted says how many)",
    )

    @property
    def records_picks(self) -> bool:
        return self.regret or self.scores_header


class Config(StrictModel):
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    pool: PoolConfig | None = None
    scheduler: dict[str, Any] | None = Field(
        default=None,
        description="EndpointPickerConfig: plugins and schedulingProfiles. Omitted: the predicted-latency "
        "pipeline when a predictor is configured, else the heuristic default",
    )
    predictor: PredictorConfig | None = Field(default=None, description="omitted: no latency predictor")
    objectives: dict[str, ObjectiveConfig] = Field(
        default_factory=dict, description="x-gateway-inference-objective NAME → priority"
    )
    seed: int | None = Field(default=None, description="seeds the scheduler's RNG (random pickers)")
    flow_control: FlowControlConfig = Field(
        default_factory=FlowControlConfig,
        alias="flowControl",
        description="hold requests in the router while the pool is saturated (docs/configuration.md)",
    )
    tracing: TracingConfig = Field(
        default_factory=TracingConfig, description="OpenTelemetry spans of the requests (off by default)"
    )
    tuning: TuningConfig = Field(
        default_factory=TuningConfig, description="the pipeline tunes itself to the pool (off by default)"
    )
    hedging: HedgingConfig = Field(
        default_factory=HedgingConfig, description="the budget and delay of hedged requests"
    )
    audit: AuditConfig = Field(
        default_factory=AuditConfig, description="routing regret and scores on the wire (off by default)"
    )

    @property
    def prediction_enabled(self) -> bool:
        return self.predictor is not None and self.predictor.mode != "off"

    @property
    def flow_control_enabled(self) -> bool:
        """``flowControl.enabled``; unset: on with the built-in predicted-latency pipeline (a predictor and no
        ``scheduler`` section), off with the heuristic profile or a scheduler of the user's own."""
        enabled = self.flow_control.enabled
        if enabled is None:
            return self.scheduler is None and self.prediction_enabled
        return enabled

    @model_validator(mode="after")
    def _engine_priorities_are_sent(self) -> Config:
        sent = self.pool is not None and self.pool.engine_priority_anywhere
        for name, objective in self.objectives.items():
            if objective.engine_priority is not None and not sent:
                raise ValueError(
                    f"objectives.{name}.engine_priority is set, but no model server is sent a priority: turn "
                    "on pool.engine_priority (or an endpoint's)"
                )
            if sent and abs(objective.priority) > ENGINE_PRIORITY_LIMIT and objective.engine_priority is None:
                raise ValueError(
                    f"objectives.{name}.priority {objective.priority} is beyond the 64-bit priority the "
                    f"model servers take: set objectives.{name}.engine_priority"
                )
        return self

    def objective_priorities(self) -> dict[str, int]:
        return {name: objective.priority for name, objective in self.objectives.items()}

    def objective_engine_priorities(self) -> dict[str, int]:
        """The priority each objective's requests carry to the model servers (``engine_priority``, else
        ``priority``), in the router's sense: higher first."""
        return {name: objective.engine_value for name, objective in self.objectives.items()}


def parse_config(data: Any, source: str = "config") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {format_validation_error(exc, '')}") from exc


def load_config(path: str | Path) -> Config:
    try:
        data = load_yaml_mapping(path, "serve config")
    except YAMLFileError as exc:
        raise ConfigError(str(exc)) from None
    return parse_config(data, str(Path(path)))
