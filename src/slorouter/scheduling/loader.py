"""The loader: turns a validated ``SchedulerConfig`` into plugins, profiles and a ``Scheduler``.

It applies the original's defaulting (reference §1.3): names default to types, a ``default`` profile is
synthesized when none is configured, a profile handler and a picker are added when missing, scorer weights
default to 1.0, and producers are auto-created for consumed data keys and ordered producer-before-consumer.
Every error names the place in the config it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from slorouter.scheduling.config_schema import (
    DEFAULT_DATA_PRODUCER_TIMEOUT_MS,
    DEFAULT_PICKER,
    DEFAULT_PROFILE_HANDLER,
    DEFAULT_PROFILE_NAME,
    DEFAULT_SCORER_WEIGHT,
    PluginSpec,
    ProfilePluginRef,
    SchedulerConfig,
    SchedulerConfigError,
    SchedulingProfileSpec,
    parse_scheduler_config,
)
from slorouter.scheduling.pipelines import DEFAULT_SCHEDULER_CONFIG
from slorouter.scheduling.plugin import (
    Admitter,
    CandidateSwitch,
    DataProducer,
    Filter,
    LatencyPredicting,
    Picker,
    Plugin,
    PluginContext,
    PreRequest,
    ProfileHandler,
    ResponseBodyProcessor,
    ResponseHeaderProcessor,
    Scorer,
)
from slorouter.scheduling.registry import UnknownPluginTypeError, default_producer_type, plugin_class
from slorouter.scheduling.scheduler import Scheduler, SchedulerProfile, WeightedScorer
from slorouter.validation import format_validation_error, join_location


@dataclass
class SchedulerSetup:
    """Everything the loader built. Lists are in a deterministic order: declaration order (auto-created
    plugins last), except ``data_producers``, which are ordered producer-before-consumer (ties in
    declaration order)."""

    scheduler: Scheduler
    plugins: dict[str, Plugin]
    data_producers: list[DataProducer] = field(default_factory=list)
    admitters: list[Admitter] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    response_header_processors: list[ResponseHeaderProcessor] = field(default_factory=list)
    response_body_processors: list[ResponseBodyProcessor] = field(default_factory=list)
    auto_created: list[str] = field(default_factory=list)  # names of plugins the loader added
    effective_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    data_producer_timeout_s: float = DEFAULT_DATA_PRODUCER_TIMEOUT_MS / 1000.0
    # Whether the latency predictions' "TTFT" is the end-to-end latency (a producer in non-streaming mode).
    predicts_end_to_end: bool = False

    @property
    def candidate_switch(self) -> CandidateSwitch | None:
        """The profile handler, when it switches between candidate pipelines (the tuner's lever)."""
        handler = self.scheduler.profile_handler
        return handler if isinstance(handler, CandidateSwitch) else None


SCHEDULING_KINDS = (Filter, Scorer, Picker)


def _label(name: str, type_name: str) -> str:
    return name if name == type_name else f"{name}/{type_name}"


class _Builder:
    def __init__(self, config: SchedulerConfig, ctx: PluginContext, location: str) -> None:
        self.config = config
        self.ctx = ctx
        self.location = location
        self.plugins: dict[str, Plugin] = {}
        self.auto_created: list[str] = []

    def where(self, sub: str) -> str:
        return join_location(self.location, sub)

    def fail(self, sub: str, message: str) -> SchedulerConfigError:
        where = self.where(sub)
        return SchedulerConfigError(f"{where}: {message}" if where else message)

    # plugins
    def instantiate_declared(self) -> None:
        declared_at: dict[str, int] = {}
        for i, spec in enumerate(self.config.plugins):
            name = spec.effective_name
            if name in declared_at:
                hint = "" if spec.name else "; name each instance of a type"
                raise self.fail(
                    f"plugins[{i}].name",
                    f"duplicate plugin name {name!r} (plugins[{declared_at[name]}] has it too{hint})",
                )
            declared_at[name] = i
            self.plugins[name] = self._instantiate(spec.type, name, spec.parameters, f"plugins[{i}]")

    def _instantiate(self, type_name: str, name: str, parameters: dict[str, Any] | None, sub: str) -> Plugin:
        try:
            cls = plugin_class(type_name)
        except UnknownPluginTypeError as exc:
            raise self.fail(f"{sub}.type", str(exc)) from None
        where = f"{self.where(sub)} ({_label(name, type_name)})"
        try:
            params = cls.Params.model_validate(parameters or {})
        except ValidationError as exc:
            raise SchedulerConfigError(f"{where}: {format_validation_error(exc, 'parameters')}") from None
        try:
            return cls(name, params, self.ctx)
        except (ValueError, TypeError) as exc:
            raise SchedulerConfigError(f"{where}: {exc}") from None

    def add_default(self, type_name: str, reason: str) -> Plugin:
        """Instantiate a plugin the config did not declare, with default parameters, named after its type."""
        existing = self.plugins.get(type_name)
        if existing is not None:
            raise self.fail(
                "plugins",
                f"{reason} needs a {type_name!r} plugin, but the name {type_name!r} is taken by a "
                f"{existing.type_name!r} plugin",
            )
        plugin = self._instantiate(type_name, type_name, None, f"<auto {type_name}>")
        self.plugins[type_name] = plugin
        self.auto_created.append(type_name)
        return plugin

    # profiles
    def profile_refs(self) -> list[tuple[str, list[ProfilePluginRef]]]:
        specs = self.config.scheduling_profiles
        if not specs:
            # Every filter and scorer, in declaration order, and the first picker (a profile has one).
            refs: list[ProfilePluginRef] = []
            has_picker = False
            for name, plugin in self.plugins.items():
                if isinstance(plugin, Filter | Scorer) or (isinstance(plugin, Picker) and not has_picker):
                    refs.append(ProfilePluginRef(plugin_ref=name))
                    has_picker = has_picker or isinstance(plugin, Picker)
            return [(DEFAULT_PROFILE_NAME, refs)]
        seen: dict[str, int] = {}
        for i, spec in enumerate(specs):
            if spec.name in seen:
                raise self.fail(
                    f"schedulingProfiles[{i}].name",
                    f"duplicate profile name {spec.name!r} (also at schedulingProfiles[{seen[spec.name]}])",
                )
            seen[spec.name] = i
            used: set[str] = set()
            for j, ref in enumerate(spec.plugins):
                sub = f"schedulingProfiles[{i}].plugins[{j}].pluginRef"
                if ref.plugin_ref not in self.plugins:
                    raise self.fail(
                        sub,
                        f"no plugin named {ref.plugin_ref!r} (declared: {', '.join(self.plugins) or 'none'})",
                    )
                if ref.plugin_ref in used:
                    raise self.fail(
                        sub, f"plugin {ref.plugin_ref!r} is referenced twice in profile {spec.name!r}"
                    )
                used.add(ref.plugin_ref)
        return [(spec.name, list(spec.plugins)) for spec in specs]

    def profile_handler(self, profile_names: list[str]) -> ProfileHandler:
        handlers = [(name, p) for name, p in self.plugins.items() if isinstance(p, ProfileHandler)]
        if len(handlers) > 1:
            raise self.fail("plugins", f"more than one profile handler: {', '.join(n for n, _ in handlers)}")
        if handlers:
            name, handler = handlers[0]
        elif len(profile_names) == 1:
            plugin = self.add_default(DEFAULT_PROFILE_HANDLER, "a single profile")
            assert isinstance(plugin, ProfileHandler)
            name, handler = DEFAULT_PROFILE_HANDLER, plugin
        else:
            raise self.fail(
                "plugins",
                f"{len(profile_names)} scheduling profiles need a profile handler plugin; none is configured",
            )
        try:
            handler.validate_profiles(profile_names)
        except ValueError as exc:
            raise self.fail("schedulingProfiles", f"profile handler {name!r}: {exc}") from None
        return handler

    def build_profiles(
        self, refs_by_profile: list[tuple[str, list[ProfilePluginRef]]]
    ) -> list[SchedulerProfile]:
        profiles = []
        fallback_picker: Picker | None = None
        for index, (profile_name, refs) in enumerate(refs_by_profile):
            filters: list[Filter] = []
            scorers: list[WeightedScorer] = []
            pickers: list[str] = []
            for ref in refs:
                plugin = self.plugins[ref.plugin_ref]
                if isinstance(plugin, Filter):
                    filters.append(plugin)
                if isinstance(plugin, Scorer):
                    weight = DEFAULT_SCORER_WEIGHT if ref.weight is None else ref.weight
                    scorers.append(WeightedScorer(plugin, weight))
                if isinstance(plugin, Picker):
                    pickers.append(ref.plugin_ref)
            if len(pickers) > 1:
                sub = f"schedulingProfiles[{index}]" if self.config.scheduling_profiles else "plugins"
                raise self.fail(
                    sub, f"profile {profile_name!r} has more than one picker: {', '.join(pickers)}"
                )
            if pickers:
                chosen = self.plugins[pickers[0]]
                assert isinstance(chosen, Picker)
                picker: Picker = chosen
            else:
                fallback_picker = fallback_picker or self._first_picker()
                picker = fallback_picker
            profiles.append(SchedulerProfile(profile_name, filters, scorers, picker))
        return profiles

    def _first_picker(self) -> Picker:
        for plugin in self.plugins.values():
            if isinstance(plugin, Picker):
                return plugin
        picker = self.add_default(DEFAULT_PICKER, "a profile without a picker")
        assert isinstance(picker, Picker)
        return picker

    # producers
    def add_missing_producers(self) -> None:
        """Auto-create the default producer of every consumed key nobody produces (and of their keys)."""
        produced = {key for p in self.plugins.values() if isinstance(p, DataProducer) for key in p.produces}
        checked = 0
        while checked < len(self.plugins):  # auto-created producers may consume keys in turn
            consumer_name, consumer = list(self.plugins.items())[checked]
            checked += 1
            for key in consumer.consumes:
                if key in produced:
                    continue
                producer_type = default_producer_type(key)
                if producer_type is None:
                    raise self.fail(
                        "plugins",
                        f"plugin {consumer_name!r} consumes {key!r}, which no configured plugin produces "
                        "and which has no default producer",
                    )
                producer = self.add_default(producer_type, f"plugin {consumer_name!r} (consumes {key!r})")
                assert isinstance(producer, DataProducer)
                produced.update(producer.produces)

    def ordered_producers(self) -> list[DataProducer]:
        """Producers before their consumers; ties in declaration order. A dependency cycle is an error."""
        producers = [p for p in self.plugins.values() if isinstance(p, DataProducer)]
        producers_of: dict[str, list[int]] = {}
        for i, producer in enumerate(producers):
            for key in producer.produces:
                producers_of.setdefault(key, []).append(i)
        depends_on: list[set[int]] = []
        for i, producer in enumerate(producers):
            depends_on.append({j for key in producer.consumes for j in producers_of.get(key, ()) if j != i})
        ordered: list[int] = []
        done: set[int] = set()
        while len(ordered) < len(producers):
            ready = [i for i in range(len(producers)) if i not in done and depends_on[i] <= done]
            if not ready:
                stuck = [repr(producers[i]) for i in range(len(producers)) if i not in done]
                raise self.fail(
                    "plugins", f"data producers depend on each other in a cycle: {', '.join(stuck)}"
                )
            ordered.append(ready[0])
            done.add(ready[0])
        return [producers[i] for i in ordered]

    def data_producer_timeout_ms(self) -> float:
        timeout = self.config.data_producer_timeout_ms
        return DEFAULT_DATA_PRODUCER_TIMEOUT_MS if timeout is None else timeout

    def effective_config(self, profiles: list[SchedulerProfile]) -> SchedulerConfig:
        plugin_specs = [
            PluginSpec(
                type=plugin.type_name,
                name=name,
                parameters=plugin.params.model_dump(by_alias=True, exclude_none=True) or None,
            )
            for name, plugin in self.plugins.items()
        ]
        name_of = {id(plugin): name for name, plugin in self.plugins.items()}
        profile_specs = []
        for profile in profiles:
            weights: dict[str, float | None] = {name_of[id(f)]: None for f in profile.filters}
            for weighted in profile.scorers:
                weights[name_of[id(weighted.scorer)]] = weighted.weight
            weights.setdefault(name_of[id(profile.picker)], None)
            refs = [ProfilePluginRef(plugin_ref=name, weight=weight) for name, weight in weights.items()]
            profile_specs.append(SchedulingProfileSpec(name=profile.name, plugins=refs))
        return SchedulerConfig(
            api_version=self.config.api_version,
            kind=self.config.kind,
            plugins=plugin_specs,
            scheduling_profiles=profile_specs,
            data_producer_timeout_ms=self.data_producer_timeout_ms(),
        )


def build_scheduler_setup(
    config: dict[str, Any] | SchedulerConfig | None, ctx: PluginContext, *, location: str = "scheduler"
) -> SchedulerSetup:
    """Instantiate and wire the configured plugins; ``None`` (or a config without plugins and profiles)
    gives the built-in default. Raises ``SchedulerConfigError`` naming the offending field, prefixed with
    ``location`` (the config's place in the enclosing file)."""
    parsed = parse_scheduler_config(config, location) if config is not None else None
    if parsed is None or parsed.is_empty:
        parsed = SchedulerConfig.model_validate(DEFAULT_SCHEDULER_CONFIG)
    builder = _Builder(parsed, ctx, location)
    builder.instantiate_declared()
    refs_by_profile = builder.profile_refs()
    handler = builder.profile_handler([name for name, _ in refs_by_profile])
    profiles = builder.build_profiles(refs_by_profile)
    builder.add_missing_producers()
    producers = builder.ordered_producers()
    plugins = list(builder.plugins.values())
    return SchedulerSetup(
        scheduler=Scheduler(profiles, handler),
        plugins=dict(builder.plugins),
        data_producers=producers,
        admitters=[p for p in plugins if isinstance(p, Admitter)],
        pre_request=[p for p in plugins if isinstance(p, PreRequest)],
        response_header_processors=[p for p in plugins if isinstance(p, ResponseHeaderProcessor)],
        response_body_processors=[p for p in plugins if isinstance(p, ResponseBodyProcessor)],
        auto_created=list(builder.auto_created),
        effective_config=builder.effective_config(profiles),
        data_producer_timeout_s=builder.data_producer_timeout_ms() / 1000.0,
        predicts_end_to_end=any(p.predicts_end_to_end for p in plugins if isinstance(p, LatencyPredicting)),
    )
