"""The routing policies the benchmark compares, each an ``EndpointPickerConfig`` run by the same framework.

Built in (``POLICY_NAMES``): ``random``, ``round-robin``, ``least-request``, ``heuristic`` (queue 2, KV 2,
prefix 3 — the original's default), ``heuristic-tuned`` (3, 2, 2 — its best hand-tuned blend),
``token-aware`` (prefix-affinity filter 0.8 with its throughput TTFT gate, token-load scorer on uncached
prefill tokens, max-score picker — llm-d's current default, "Sticky Until Saturated")
and ``predicted-latency`` (the shipped pipeline, with streaming-mode training since the benchmark streams).
``heuristic-precise``, ``heuristic-tuned-precise``, ``token-aware-precise`` and ``predicted-latency-precise``
are those pipelines with ``precise-prefix-cache-producer`` reading the engines' KV events;
``predicted-ranking`` is the pipeline that was built in before the load-core one
(``PREDICTION_RANKING_SCHEDULER_CONFIG``, ranking by the XGBoost TTFT prediction) and ``predicted-load-core``
an older name of the built-in one (both with streaming-mode training, named only, not run
by default).
The three baselines that read the prefix index (heuristic, heuristic-tuned, token-aware) index prompts only,
as the originals do. A user policy is a scheduler config file: ``NAME=PATH`` or just ``PATH`` (named after
the file); it uses the embedded predictor when it declares a ``predicted-latency-producer``.
Any policy followed by ``+fc`` (``token-aware+fc``) is the same policy behind flow control, with the
``flowControl`` defaults (``enabled: true``) or the section given (``load_flow_control_file``).
Followed by ``+slo`` (``predicted-latency+slo``, ``token-aware+fc+slo``) it keeps SLOs after the pick:
deadlines per objective (``objectives.NAME.deadline``: requests are ``critical``, ``standard`` or
``sheddable`` by priority; by default the first two are hedged and the last cancelled at its TTFT SLO) and
the ``hedging`` section's budget and delay (``load_deadlines_file``). Last, ``+prio`` sends each request's
priority to the pods' engines in vLLM's form (``pool.engine_priority``), which pods with the engine variant
``queue=priority`` (``priority-queue``) serve by.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from slorouter.bench.tuning.tuner import TuningSettings
from slorouter.config import HedgingConfig, ObjectiveConfig
from slorouter.flowcontrol.config import FlowControlConfig
from slorouter.scheduling.config_schema import load_scheduler_config_file
from slorouter.scheduling.pipelines import (
    DEFAULT_SCHEDULER_CONFIG,
    PREDICTED_LATENCY_SCHEDULER_CONFIG,
    PREDICTION_RANKING_SCHEDULER_CONFIG,
    SELF_TUNING_SCHEDULER_CONFIG,
    TOKEN_AWARE_AFFINITY,
    heuristic_blend_profile,
)
from slorouter.validation import format_validation_error
from slorouter.yamlfile import YAMLFileError, load_yaml_mapping

PREDICTOR_PLUGIN = "predicted-latency-producer"
FLOW_CONTROL_SUFFIX = "+fc"
SLO_SUFFIX = "+slo"
PRIORITY_SUFFIX = "+prio"
KV_EVENT_PLUGINS = ("precise-prefix-cache-producer", "precise-prefix-cache-scorer")


@dataclass(frozen=True, slots=True)
class Deadlines:
    """The ``objectives`` (by the benchmark's objective names) and ``hedging`` sections a ``+slo`` policy
    runs with."""

    objectives: dict[str, ObjectiveConfig]
    hedging: HedgingConfig


DEFAULT_DEADLINES = Deadlines(
    objectives={
        "critical": ObjectiveConfig(priority=1, deadline={"action": "hedge"}),
        "standard": ObjectiveConfig(priority=0, deadline={"action": "hedge"}),
        "sheddable": ObjectiveConfig(priority=-1, deadline={"action": "cancel"}),
    },
    hedging=HedgingConfig(),
)


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    config: dict[str, Any]  # EndpointPickerConfig shape
    source: str  # "built-in" or the file it came from
    flow_control: FlowControlConfig | None = None  # None: requests go to scheduling at once
    tuning: TuningSettings | None = None  # the self-tuning policy's tuner
    deadlines: Deadlines | None = None  # +slo: what happens when a request overruns its SLO after the pick
    engine_priority: bool = False  # +prio: each request's priority reaches the engine (vLLM's form)

    @property
    def uses_predictor(self) -> bool:
        return any(p.get("type") == PREDICTOR_PLUGIN for p in self.config.get("plugins", []))

    @property
    def uses_kv_events(self) -> bool:
        """Whether the policy reads the pods' KV events (the benchmark then delivers them)."""
        return any(p.get("type") in KV_EVENT_PLUGINS for p in self.config.get("plugins", []))


def _single_profile(plugins: list[dict[str, Any]], refs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"plugins": plugins, "schedulingProfiles": [{"name": "default", "plugins": refs}]}


def _weighted_heuristic(queue: float, kv: float, prefix: float) -> dict[str, Any]:
    return _single_profile(
        [
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "prefix-cache-scorer"},
            {"type": "max-score-picker"},
        ],
        heuristic_blend_profile("default", queue, kv, prefix)["plugins"],
    )


def _prompts_only(config: dict[str, Any]) -> dict[str, Any]:
    """The policy with a prefix index of prompts only, as the original's: slorouter's also follows replies
    (``indexResponses``), which the baselines should not get for free."""
    config = copy.deepcopy(config)
    config["plugins"].append(
        {"type": "approx-prefix-cache-producer", "parameters": {"indexResponses": False}}
    )
    return config


def _predicted_latency(pipeline: dict[str, Any] = PREDICTED_LATENCY_SCHEDULER_CONFIG) -> dict[str, Any]:
    config = copy.deepcopy(pipeline)
    for plugin in config["plugins"]:
        if plugin["type"] == PREDICTOR_PLUGIN:
            plugin["parameters"] = {**plugin.get("parameters", {}), "streamingMode": True}
    return config


# llm-d's optimized baseline as benchmarked in "Sticky Until Saturated" (blog 2026-08-17): affinity 0.8, the
# TTFT gate on in-flight uncached tokens / peak prefill throughput (18 s penalty), no exploration. The
# token-load scorer's defaults are llm-d's current ones (uncached in-flight prefill + this request's own
# uncached prompt).
TOKEN_AWARE_AFFINITY_PARAMETERS: dict[str, Any] = TOKEN_AWARE_AFFINITY

BUILTIN_POLICIES: dict[str, dict[str, Any]] = {
    "random": _single_profile([{"type": "random-picker"}], [{"pluginRef": "random-picker"}]),
    "round-robin": _single_profile([{"type": "round-robin-picker"}], [{"pluginRef": "round-robin-picker"}]),
    "least-request": _single_profile(
        [{"type": "least-request-scorer"}, {"type": "max-score-picker"}],
        [{"pluginRef": "least-request-scorer"}, {"pluginRef": "max-score-picker"}],
    ),
    "heuristic": _prompts_only(DEFAULT_SCHEDULER_CONFIG),
    "heuristic-tuned": _prompts_only(_weighted_heuristic(3, 2, 2)),
    "token-aware": _prompts_only(
        _single_profile(
            [
                {"type": "prefix-cache-affinity-filter", "parameters": TOKEN_AWARE_AFFINITY_PARAMETERS},
                {"type": "token-load-scorer"},
                {"type": "max-score-picker"},
            ],
            [
                {"pluginRef": "prefix-cache-affinity-filter"},
                {"pluginRef": "token-load-scorer"},
                {"pluginRef": "max-score-picker"},
            ],
        )
    ),
    "predicted-latency": _predicted_latency(),
}
POLICY_NAMES: tuple[str, ...] = tuple(BUILTIN_POLICIES)


def _precise(config: dict[str, Any]) -> dict[str, Any]:
    """The policy with the prefix index fed by the pods' KV events: ``precise-prefix-cache-producer`` in
    place of the approximate producer (same parameters, so the fallback for silent pods is the same index)."""
    config = copy.deepcopy(config)
    producers = [p for p in config["plugins"] if p["type"] == "approx-prefix-cache-producer"]
    for plugin in producers:
        plugin["type"] = "precise-prefix-cache-producer"
    if not producers:
        config["plugins"].append({"type": "precise-prefix-cache-producer"})
    return config


# The KV-event variants, the ranking pipeline and the built-in one under its older name, by name only: not
# in POLICY_NAMES, so a default run is unchanged.
NAMED_POLICIES: dict[str, dict[str, Any]] = {
    f"{name}-precise": _precise(BUILTIN_POLICIES[name])
    for name in ("heuristic", "heuristic-tuned", "token-aware", "predicted-latency")
}
NAMED_POLICIES["predicted-ranking"] = _predicted_latency(PREDICTION_RANKING_SCHEDULER_CONFIG)
NAMED_POLICIES["predicted-load-core"] = _predicted_latency(PREDICTED_LATENCY_SCHEDULER_CONFIG)
SELF_TUNING = "self-tuning"
NAMED_POLICIES[SELF_TUNING] = _predicted_latency(SELF_TUNING_SCHEDULER_CONFIG)
# The benchmark's tuner: a round every 30 s of virtual time on the last 120 s, the first after 45 s of traffic
# (runs are minutes long; a router's default is a round every 3 minutes on the last 2, after a minute).
BENCH_TUNING = TuningSettings(interval_s=30.0, window_s=120.0, warmup_share=0.35, min_span_s=45.0)


class PolicyError(ValueError):
    pass


def load_flow_control_file(path: str | Path) -> FlowControlConfig:
    """The ``flowControl`` section of a YAML file (the file may hold the section alone), enabled."""
    try:
        data = load_yaml_mapping(path, "flow-control config") or {}
    except YAMLFileError as exc:
        raise PolicyError(str(exc)) from None
    section = data.get("flowControl", data)
    try:
        return FlowControlConfig.model_validate({**section, "enabled": True})
    except ValidationError as exc:
        raise PolicyError(f"{path}: {format_validation_error(exc, 'flowControl')}") from None


def load_deadlines_file(path: str | Path) -> Deadlines:
    """The ``objectives`` (named ``critical``, ``standard``, ``sheddable``) and ``hedging`` sections of a YAML
    file, for the ``+slo`` policies; an objective left out keeps its default."""
    try:
        data = load_yaml_mapping(path, "deadlines config") or {}
    except YAMLFileError as exc:
        raise PolicyError(str(exc)) from None
    unknown = set(data) - {"objectives", "hedging"}
    if unknown:
        raise PolicyError(f"{path}: unknown keys {sorted(unknown)} (expected objectives, hedging)")
    objectives = dict(DEFAULT_DEADLINES.objectives)
    try:
        for name, section in (data.get("objectives") or {}).items():
            if name not in objectives:
                known = ", ".join(sorted(objectives))
                raise PolicyError(f"{path}: objectives.{name}: the benchmark's objectives are {known}")
            objectives[name] = ObjectiveConfig.model_validate(section)
        hedging = HedgingConfig.model_validate(data.get("hedging") or {})
    except ValidationError as exc:
        raise PolicyError(f"{path}: {format_validation_error(exc, '')}") from None
    return Deadlines(objectives, hedging)


def resolve_policy(
    spec: str, flow_control: FlowControlConfig | None = None, deadlines: Deadlines | None = None
) -> Policy:
    """A built-in name, ``NAME=PATH`` or ``PATH`` (a YAML ``EndpointPickerConfig``), each maybe with
    ``+fc``: behind ``flow_control`` (default: the ``flowControl`` defaults, enabled), maybe then with
    ``+slo``: with ``deadlines`` (default: ``DEFAULT_DEADLINES``), and maybe last with ``+prio``: each
    request's priority sent to the engines."""
    spec = spec.strip()
    if spec.endswith(PRIORITY_SUFFIX):
        base = resolve_policy(spec.removesuffix(PRIORITY_SUFFIX), flow_control, deadlines)
        return dataclasses.replace(base, name=base.name + PRIORITY_SUFFIX, engine_priority=True)
    if spec.endswith(SLO_SUFFIX):
        base = resolve_policy(spec.removesuffix(SLO_SUFFIX), flow_control)
        return dataclasses.replace(
            base, name=base.name + SLO_SUFFIX, deadlines=deadlines or DEFAULT_DEADLINES
        )
    if spec.endswith(FLOW_CONTROL_SUFFIX):
        base = resolve_policy(spec.removesuffix(FLOW_CONTROL_SUFFIX))
        return dataclasses.replace(
            base,
            name=base.name + FLOW_CONTROL_SUFFIX,
            flow_control=flow_control or FlowControlConfig.model_validate({"enabled": True}),
        )
    builtin = BUILTIN_POLICIES.get(spec) or NAMED_POLICIES.get(spec)
    if builtin is not None:
        return Policy(
            spec, copy.deepcopy(builtin), "built-in", tuning=BENCH_TUNING if spec == SELF_TUNING else None
        )
    name, sep, path = spec.partition("=")
    if not sep:
        name, path = Path(spec).stem, spec
    if not path.endswith((".yaml", ".yml")) and not Path(path).exists():
        raise PolicyError(
            f"unknown policy {spec!r}: use one of {', '.join((*POLICY_NAMES, *NAMED_POLICIES))}, or "
            "NAME=PATH / PATH of a scheduler config file"
        )
    parsed = load_scheduler_config_file(path)  # raises SchedulerConfigError naming the file and field
    config = parsed.model_dump(by_alias=True, exclude_none=True)
    return Policy(name or Path(path).stem, config, path)


def resolve_policies(
    specs: list[str],
    *,
    with_flow_control: bool = False,
    flow_control: FlowControlConfig | None = None,
    deadlines: Deadlines | None = None,
) -> list[Policy]:
    """The policies of ``specs``; with ``with_flow_control`` each one followed by its ``+fc`` variant, and
    every ``+fc`` one behind ``flow_control`` when given."""
    if with_flow_control:
        specs = [
            variant
            for spec in specs
            for variant in (spec, spec if spec.strip().endswith(FLOW_CONTROL_SUFFIX) else spec + "+fc")
        ]
        specs = list(dict.fromkeys(specs))
    policies = [resolve_policy(spec, flow_control, deadlines) for spec in specs]
    names = [p.name for p in policies]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PolicyError(f"policy names must be unique; repeated: {', '.join(duplicates)}")
    if not policies:
        raise PolicyError("no policy given")
    return policies
