"""The ``pool`` section of the configuration: which model servers to route to and how to watch them."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from slorouter.pool.dialects import AUTO, MODEL_SERVER_TYPES, Dialect, override, parse_spec, preset
from slorouter.pool.kv_index import DEFAULT_MAX_BLOCKS_PER_POD
from slorouter.pool.kv_trust import TrustThresholds
from slorouter.pool.state import DEFAULT_FALLBACK_KV_CAPACITY_TOKENS, Endpoint
from slorouter.validation import StrictModel

log = logging.getLogger(__name__)
# The pod label naming a discovered pod's model server type (the original's engineLabelKey default).
DEFAULT_ENGINE_LABEL_KEY = "llm-d.ai/engine-type"


def validate_address(address: str) -> str:
    """Check a ``host:port`` (IPv6 hosts in brackets: ``[::1]:8000``) and return it unchanged."""
    if not isinstance(address, str):
        raise ValueError(f"expected a 'host:port' string, got {address!r}")
    if "://" in address or "/" in address:
        raise ValueError(f"{address!r} must be a bare 'host:port', without scheme or path")
    if any(ch.isspace() for ch in address):
        raise ValueError(f"{address!r} must not contain whitespace")
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"{address!r} has no port: expected 'host:port'")
    if host.startswith("["):
        if not host.endswith("]") or len(host) == 2:
            raise ValueError(f"{address!r}: an IPv6 host must be written '[addr]:port'")
    elif not host or ":" in host:
        raise ValueError(f"{address!r} has an empty or malformed host: expected 'host:port'")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{address!r}: port must be an integer in 1-65535")
    return address


def validate_zmq_endpoint(endpoint: str) -> str:
    """Check a ZMQ address a subscriber connects to: ``tcp://host:port``, ``ipc://path`` or ``inproc://name``."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise ValueError(f"{endpoint!r} must be a ZMQ address: tcp://host:port, ipc://path or inproc://name")
    if scheme == "tcp":
        validate_address(rest)
    return endpoint


class KVEventsSourceConfig(StrictModel):
    """Where a model server publishes its KV events (vLLM ``--kv-events-config``: ``endpoint``,
    ``replay_endpoint``, ``topic``; here the addresses the router connects to)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""  # prefix filter of the SUB socket; "" takes every topic

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        return None if value is None else validate_zmq_endpoint(value)


# How a model server type takes a request's priority: the integer body field ``priority``, which vLLM
# (``--scheduling-policy priority``) runs lower values first and SGLang (``--enable-priority-scheduling``)
# higher values first. The other types take none (docs/design/engine-priority.md).
EngineOrder = Literal["lower-first", "higher-first"]
LOWER_FIRST: EngineOrder = "lower-first"
HIGHER_FIRST: EngineOrder = "higher-first"
ENGINE_PRIORITY_ORDERS: dict[str, EngineOrder] = {"vllm": LOWER_FIRST, "sglang": HIGHER_FIRST}


class EnginePriorityConfig(StrictModel):
    """Send each request's priority to its model server in the body field it takes (``true``/``false`` are
    short for ``{enabled: ...}``). ``order`` says how the server runs the field's values, for a server
    whose model server type does not say it (``auto``, a type without a priority field, or SGLang run with
    ``--schedule-low-priority-values-first``)."""

    enabled: bool = Field(default=True, description="send the priority (false: this endpoint gets none)")
    order: EngineOrder | None = Field(
        default=None,
        description="lower-first (vLLM) or higher-first (SGLang); default: from the model server type",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value


def engine_priority_order(model_server_type: str) -> EngineOrder | None:
    """How a model server type (a preset name or alias, not ``auto``) takes a priority; None: not at all."""
    return ENGINE_PRIORITY_ORDERS.get(preset(model_server_type).name)


def _is_type(name: str) -> bool:
    try:
        preset(name)
    except ValueError:
        return False
    return True


def validate_model_server_type(value: str) -> str:
    try:
        if value != AUTO:
            preset(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not a model server type: expected one of {', '.join(MODEL_SERVER_TYPES)}"
        ) from None
    return value


_SPEC_FIELDS = {
    "queued_requests": "waiting",
    "running_requests": "running",
    "kv_usage": "kv_usage",
    "cache_block_size": "cache_block_size",
    "cache_num_blocks": "cache_num_blocks",
}


class ModelServerMetricsConfig(StrictModel):
    """Metric specs overriding those of a model server type's preset, in the shape of the original's
    ``engineConfigs`` (``queuedRequestsSpec`` ...). A spec is ``name`` or ``name{label="value",...}``;
    ``""`` reads nothing for that signal (the router's in-flight counts stand in); unset keeps the
    preset's."""

    queued_requests: str | None = Field(default=None, description="queue depth (queuedRequestsSpec)")
    running_requests: str | None = Field(default=None, description="running requests (runningRequestsSpec)")
    kv_usage: str | None = Field(default=None, description="KV-cache utilisation, 0..1 (kvUsageSpec)")
    lora_info: str | None = Field(default=None, description="LoRA info gauge (loraSpec); not routed on yet")
    cache_info: str | None = Field(default=None, description="cache info gauge (cacheInfoSpec)")
    cache_block_size_label: str | None = Field(default=None, description="its block-size label")
    cache_num_blocks_label: str | None = Field(default=None, description="its block-count label")
    cache_block_size: str | None = Field(default=None, description="block size as a gauge")
    cache_num_blocks: str | None = Field(default=None, description="block count as a gauge")

    @field_validator(
        "queued_requests",
        "running_requests",
        "kv_usage",
        "lora_info",
        "cache_info",
        "cache_block_size",
        "cache_num_blocks",
    )
    @classmethod
    def _check_spec(cls, value: str | None) -> str | None:
        if value:
            parse_spec(value)
        return value

    @field_validator("cache_block_size_label", "cache_num_blocks_label")
    @classmethod
    def _check_label(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", value):
            raise ValueError(f"{value!r} is not a Prometheus label name")
        return value

    def apply(self, base: Dialect) -> Dialect:
        fields: dict[str, object] = {}
        for key, attribute in _SPEC_FIELDS.items():
            value = getattr(self, key)
            if value is not None:
                fields[attribute] = (parse_spec(value),) if value else ()
        for key in ("lora_info", "cache_info"):
            value = getattr(self, key)
            if value is not None:
                fields[key] = parse_spec(value) if value else None
        if self.cache_block_size_label is not None:
            fields["block_size_label"] = self.cache_block_size_label
        if self.cache_num_blocks_label is not None:
            fields["num_blocks_label"] = self.cache_num_blocks_label
        return override(base, **fields)


def _dialect(model_server_type: str, metrics: ModelServerMetricsConfig | None) -> Dialect | None:
    if model_server_type == AUTO:
        return None
    base = preset(model_server_type)
    return metrics.apply(base) if metrics is not None else base


class EndpointConfig(StrictModel):
    """One model server: a bare ``"host:port"`` in YAML, or this mapping to add a name, labels and its KV
    events."""

    address: str
    name: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    kv_events: KVEventsSourceConfig | None = None
    model_server_type: str | None = Field(
        default=None, description="this server's metric dialect (a mixed pool); default: the pool's"
    )
    model_server_metrics: ModelServerMetricsConfig | None = None
    engine_priority: EnginePriorityConfig | None = Field(
        default=None, description="send the request's priority to this server; default: the pool's setting"
    )

    @field_validator("address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        return validate_address(value)

    @field_validator("model_server_type")
    @classmethod
    def _check_type(cls, value: str | None) -> str | None:
        return None if value is None else validate_model_server_type(value)


# Kubernetes names: a namespace is a DNS-1123 label, an object name a DNS-1123 subdomain.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A label value (and a label key's name part): at most 63 characters, alphanumeric at both ends.
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def validate_label_key(key: str) -> str:
    """A label key: ``[prefix/]name``, the prefix a DNS subdomain of at most 253 characters."""
    prefix, sep, name = key.rpartition("/")
    if sep and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(f"label key {key!r}: the prefix must be a DNS subdomain (e.g. 'app.kubernetes.io')")
    if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        raise ValueError(
            f"label key {key!r}: the name must be 1-63 characters, alphanumeric, '-', '_' or '.', "
            "starting and ending with an alphanumeric"
        )
    return key


def validate_label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_NAME.fullmatch(value):
        raise ValueError(
            f"label value {value!r}: at most 63 characters, alphanumeric, '-', '_' or '.', "
            "starting and ending with an alphanumeric"
        )
    return value


def validate_match_labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        validate_label_key(key)
        validate_label_value(value)
    return labels


# vLLM's default KV-event publisher port (``tcp://*:5557``), which llm-d's per-pod subscribers dial too.
DEFAULT_KV_EVENTS_PORT = 5557


class PodKVEventsConfig(StrictModel):
    """Where every discovered pod publishes its KV events, unless its ``slorouter.io/kv-events-*``
    annotations say otherwise: ports on the pod's IP (vLLM ``--kv-events-config`` with
    ``"endpoint": "tcp://*:PORT"``, ``"replay_endpoint": "tcp://*:REPLAY_PORT"``)."""

    port: int = Field(default=DEFAULT_KV_EVENTS_PORT, ge=1, le=65535, description="the PUB socket's port")
    replay_port: int | None = Field(
        default=None, ge=1, le=65535, description="the replay ROUTER socket's port; none: no replay"
    )
    topic: str = Field(default="", description="SUB prefix filter; '' takes every topic")

    @model_validator(mode="after")
    def _distinct_ports(self) -> PodKVEventsConfig:
        if self.replay_port == self.port:
            raise ValueError(f"replay_port must differ from port ({self.port})")
        return self


class KubernetesPoolConfig(StrictModel):
    """Pool membership discovered from Kubernetes: the Ready pods an InferencePool (or a plain label
    selector) selects in one namespace, one endpoint per pod IP and target port."""

    namespace: str = Field(description="the namespace of the InferencePool and its pods")
    inference_pool: str | None = Field(
        default=None, description="name of an InferencePool (inference.networking.k8s.io/v1) to follow"
    )
    label_selector: dict[str, str] | None = Field(
        default=None, description="matchLabels of the pods, instead of an InferencePool"
    )
    target_ports: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description="model-server ports on every pod; required with label_selector, overrides the "
        "InferencePool's spec.targetPorts",
    )
    kubeconfig: str | None = Field(
        default=None,
        min_length=1,
        description="kubeconfig file; omitted: the pod's service account inside a cluster, else "
        "$KUBECONFIG or ~/.kube/config",
    )
    context: str | None = Field(
        default=None, min_length=1, description="kubeconfig context; omitted: current"
    )
    watch_timeout_s: float = Field(
        default=300, gt=0, description="a watch is closed by the API server after this and resumed"
    )
    request_timeout_s: float = Field(default=30, gt=0, description="timeout of one list or get request")
    backoff_initial_ms: float = Field(default=500, gt=0, description="first pause after a failed list/watch")
    backoff_max_ms: float = Field(default=30_000, gt=0, description="the pause doubles up to this")
    initial_sync_timeout_s: float = Field(
        default=10, ge=0, description="how long start-up waits for the first list before serving anyway"
    )
    kv_events: PodKVEventsConfig | None = Field(
        default=None,
        description="subscribe to every pod's KV events on these ports (a pod's annotations override them)",
    )

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a namespace name (at most 63 lowercase alphanumerics or '-', "
                "alphanumeric at both ends)"
            )
        return value

    @field_validator("inference_pool")
    @classmethod
    def _check_pool_name(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value)):
            raise ValueError(
                f"{value!r} is not an object name (a DNS subdomain: lowercase alphanumerics, '-' and '.')"
            )
        return value

    @field_validator("label_selector")
    @classmethod
    def _check_selector(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("an empty selector would select every pod of the namespace: name some labels")
        return validate_match_labels(value)

    @field_validator("target_ports")
    @classmethod
    def _check_ports(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        for port in value:
            if not 1 <= port <= 65535:
                raise ValueError(f"port {port} is not in 1-65535")
        if len(set(value)) != len(value):
            raise ValueError(f"duplicate port in {value}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> KubernetesPoolConfig:
        if (self.inference_pool is None) == (self.label_selector is None):
            raise ValueError("set exactly one of inference_pool (an InferencePool's name) or label_selector")
        if self.label_selector is not None and self.target_ports is None:
            raise ValueError("label_selector needs target_ports (the model servers' ports on each pod)")
        if self.backoff_max_ms < self.backoff_initial_ms:
            raise ValueError("backoff_max_ms must be >= backoff_initial_ms")
        return self


class PoolConfig(StrictModel):
    """Pool membership (static endpoints, or discovered from Kubernetes) and the scraper's settings."""

    # kubernetes first: the check of endpoints reads it.
    kubernetes: KubernetesPoolConfig | None = None
    endpoints: list[EndpointConfig] = Field(default_factory=list, validate_default=True)
    scrape_interval_ms: float = Field(default=50, gt=0)
    scrape_timeout_ms: float = Field(default=1000, gt=0)
    unhealthy_after_failures: int = Field(default=3, ge=1)
    kv_events_max_blocks_per_pod: int = Field(default=DEFAULT_MAX_BLOCKS_PER_POD, ge=1)
    kv_events_replay_timeout_ms: float = Field(default=1000, gt=0)
    kv_events_reconnect_ms: float = Field(default=1000, gt=0)
    # The KV-event index's trust (slorouter.pool.kv_trust; docs/design/kv-index-trust.md).
    kv_events_lag_threshold_ms: float = Field(
        default=2000, gt=0, allow_inf_nan=False, description="a batch this far behind now: degraded (lag)"
    )
    kv_events_silent_after_ms: float = Field(
        default=5000,
        gt=0,
        allow_inf_nan=False,
        description="no batch for this long while the pod's scrape shows it serving: degraded (silent)",
    )
    kv_events_rebuild_events: int = Field(
        default=100_000, ge=1, description="after a clear, exact again once this many events were applied"
    )
    kv_events_rebuild_ms: float = Field(
        default=300_000, gt=0, allow_inf_nan=False, description="... or once this long has passed"
    )
    model_server_type: str = Field(
        default=AUTO, description="metric dialect of the pool's servers; auto: detected from the first scrape"
    )
    model_server_metrics: ModelServerMetricsConfig | None = None
    engine_label_key: str = Field(
        default=DEFAULT_ENGINE_LABEL_KEY,
        description="endpoint (pod) label whose value names the endpoint's model server type",
    )
    fallback_kv_capacity_tokens: int = Field(
        default=DEFAULT_FALLBACK_KV_CAPACITY_TOKENS,
        ge=1,
        description="KV capacity for the in-flight KV estimate of a server reporting neither KV usage "
        "nor its cache size",
    )
    engine_priority: EnginePriorityConfig | None = Field(
        default=None,
        description="send each request's priority to the model servers in the body field they take "
        "(vLLM, SGLang); default: off",
    )

    @field_validator("model_server_type")
    @classmethod
    def _check_type(cls, value: str) -> str:
        return validate_model_server_type(value)

    def kv_trust_thresholds(self) -> TrustThresholds:
        return TrustThresholds(
            lag_s=self.kv_events_lag_threshold_ms / 1000,
            silent_after_s=self.kv_events_silent_after_ms / 1000,
            rebuild_events=self.kv_events_rebuild_events,
            rebuild_s=self.kv_events_rebuild_ms / 1000,
        )

    @field_validator("engine_label_key")
    @classmethod
    def _check_label_key(cls, value: str) -> str:
        return validate_label_key(value)

    @model_validator(mode="after")
    def _overrides_need_a_preset(self) -> PoolConfig:
        if self.model_server_metrics is not None and self.model_server_type == AUTO:
            raise ValueError(
                "model_server_metrics overrides a preset: set model_server_type to it (not 'auto')"
            )
        for i, endpoint in enumerate(self.endpoints):
            kind = endpoint.model_server_type or self.model_server_type
            if endpoint.model_server_metrics is not None and kind == AUTO:
                raise ValueError(
                    f"endpoints[{i}].model_server_metrics overrides a preset: set "
                    f"endpoints[{i}].model_server_type or pool.model_server_type"
                )
        return self

    @model_validator(mode="after")
    def _engine_priority_has_a_form(self) -> PoolConfig:
        """Every endpoint the priority is sent to has a known form: an ``order``, else a model server type
        (its own, its ``engine_label_key`` label's, the pool's) that takes one; ``auto`` is not enough."""
        pool = self.engine_priority
        if pool is not None and pool.enabled and pool.order is None:
            kind = self.model_server_type
            if kind == AUTO and self.kubernetes is not None:
                raise ValueError(
                    "engine_priority: the form of the priority follows the model server type, and "
                    "model_server_type is 'auto' (detected from the metrics, which does not decide a request "
                    "field): set model_server_type (vllm or sglang; a pod's engine_label_key label still "
                    "wins) or engine_priority.order"
                )
            if kind != AUTO and engine_priority_order(kind) is None:
                raise ValueError(
                    f"engine_priority: model server type {kind!r} (model_server_type) takes no request "
                    "priority (vllm and sglang do): turn it on for the vLLM or SGLang endpoints alone "
                    "(endpoints[i].engine_priority), or set engine_priority.order for a server that takes "
                    "an integer 'priority' body field"
                )
        for i, endpoint in enumerate(self.endpoints):
            own = endpoint.engine_priority
            setting = own if own is not None else pool
            if setting is None or not setting.enabled or setting.order is not None:
                continue
            kind = self.endpoint_type(endpoint)
            if kind == AUTO:
                raise ValueError(
                    f"endpoints[{i}] ({endpoint.address}): the form of the engine priority follows its model "
                    "server type, which is 'auto' (detected from the metrics, which does not decide a "
                    f"request field): set endpoints[{i}].model_server_type or pool.model_server_type "
                    "(vllm or sglang), or engine_priority.order"
                )
            if own is not None and engine_priority_order(kind) is None:
                raise ValueError(
                    f"endpoints[{i}].engine_priority: model server type {kind!r} takes no request priority "
                    "(vllm and sglang do); set engine_priority.order for a server that takes an integer "
                    "'priority' body field"
                )
        return self

    def endpoint_type(self, endpoint: EndpointConfig) -> str:
        """A static endpoint's model server type as configured: its own, else the preset its
        ``engine_label_key`` label names, else the pool's (``auto`` included)."""
        if endpoint.model_server_type is not None:
            return endpoint.model_server_type
        label = endpoint.labels.get(self.engine_label_key)
        if label is not None and _is_type(label):
            return label
        return self.model_server_type

    @property
    def engine_priority_anywhere(self) -> bool:
        """The priority is sent to some endpoint (the pool's setting, or an endpoint's own)."""
        settings = [self.engine_priority, *(e.engine_priority for e in self.endpoints)]
        return any(setting is not None and setting.enabled for setting in settings)

    @field_validator("endpoints", mode="before")
    @classmethod
    def _expand_bare_addresses(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"address": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("endpoints")
    @classmethod
    def _reject_duplicates(cls, value: list[EndpointConfig]) -> list[EndpointConfig]:
        seen: set[str] = set()
        for endpoint in value:
            if endpoint.address in seen:
                raise ValueError(f"duplicate endpoint address {endpoint.address!r}")
            seen.add(endpoint.address)
        return value

    @field_validator("endpoints")
    @classmethod
    def _one_membership(cls, value: list[EndpointConfig], info: ValidationInfo) -> list[EndpointConfig]:
        if "kubernetes" not in info.data:  # pool.kubernetes is invalid: its own error says why
            return value
        if info.data["kubernetes"] is not None and value:
            raise ValueError("set either pool.endpoints (static model servers) or pool.kubernetes, not both")
        if info.data["kubernetes"] is None and not value:
            raise ValueError(
                "the pool needs model servers: a list of 'host:port', or pool.kubernetes instead"
            )
        return value

    @property
    def scrape_interval_s(self) -> float:
        return self.scrape_interval_ms / 1000

    @property
    def scrape_timeout_s(self) -> float:
        return self.scrape_timeout_ms / 1000


def endpoints_from_config(config: PoolConfig) -> list[Endpoint]:
    return [Endpoint(e.address, e.name, dict(e.labels)) for e in config.endpoints]


DialectResolver = Callable[[Endpoint], Dialect | None]


def dialect_resolver(config: PoolConfig) -> DialectResolver:
    """Which dialect an endpoint's page is read in (``None``: detected from its first scrape): its own
    ``model_server_type``/``model_server_metrics`` (static endpoints), else the preset its
    ``engine_label_key`` label names (discovered pods; a static endpoint's ``labels`` too), else the
    pool's."""
    pool_dialect = _dialect(config.model_server_type, config.model_server_metrics)
    per_endpoint: dict[str, Dialect | None] = {}
    for endpoint in config.endpoints:
        if endpoint.model_server_type is not None or endpoint.model_server_metrics is not None:
            kind = endpoint.model_server_type or config.model_server_type
            metrics = endpoint.model_server_metrics or config.model_server_metrics
            per_endpoint[endpoint.address] = _dialect(kind, metrics)
    key = config.engine_label_key
    warned: set[str] = set()

    def resolve(endpoint: Endpoint) -> Dialect | None:
        if endpoint.address in per_endpoint:
            return per_endpoint[endpoint.address]
        label = endpoint.labels.get(key)
        if label is not None:
            try:
                return preset(label)
            except ValueError:
                if label not in warned:
                    warned.add(label)
                    log.warning(
                        "endpoint %s: its label %s=%r is not a model server type (%s); using the pool's",
                        endpoint.address,
                        key,
                        label,
                        ", ".join(MODEL_SERVER_TYPES[1:]),
                    )
        return pool_dialect

    return resolve


EnginePriorityResolver = Callable[[Endpoint], EngineOrder | None]


def engine_priority_resolver(config: PoolConfig) -> EnginePriorityResolver:
    """How an endpoint takes a request's priority (None: it is sent none): its own ``engine_priority``, else
    the pool's; the setting's ``order``, else the one of its model server type, resolved as its metric
    dialect is (its own type, the preset its ``engine_label_key`` label names, the pool's; never the
    detected one)."""
    pool = config.engine_priority
    static: dict[str, EngineOrder | None] = {}
    for endpoint in config.endpoints:
        setting = endpoint.engine_priority if endpoint.engine_priority is not None else pool
        static[endpoint.address] = _order(setting, config.endpoint_type(endpoint))
    pool_order = _order(pool, config.model_server_type)
    key = config.engine_label_key

    def resolve(endpoint: Endpoint) -> EngineOrder | None:
        try:
            return static[endpoint.address]
        except KeyError:
            pass
        # A discovered pod: the pool's setting, in the form of its label's type or the pool's.
        label = endpoint.labels.get(key)
        if pool is None or not pool.enabled or pool.order is not None or label is None:
            return pool_order
        try:
            return engine_priority_order(label)
        except ValueError:  # not a model server type: the pool's (the dialect resolver warns)
            return pool_order

    return resolve


def _order(setting: EnginePriorityConfig | None, model_server_type: str) -> EngineOrder | None:
    if setting is None or not setting.enabled:
        return None
    if setting.order is not None:
        return setting.order
    if model_server_type == AUTO:  # then every endpoint it is sent to has a type (the config's checks)
        return None
    return engine_priority_order(model_server_type)
