"""The scheduler's configuration file: the original's ``EndpointPickerConfig`` shape, validated.

Only the shape is checked here (unknown keys, types, ranges); whether the plugins exist and fit together is
the loader's job (``slorouter.scheduling.loader``). Every error names the place in the config it comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_validator

from slorouter.validation import StrictModel, format_validation_error
from slorouter.yamlfile import YAMLFileError, load_yaml_mapping

DEFAULT_PROFILE_NAME = "default"
DEFAULT_PROFILE_HANDLER = "single-profile-handler"
DEFAULT_PICKER = "max-score-picker"
DEFAULT_SCORER_WEIGHT = 1.0
DEFAULT_DATA_PRODUCER_TIMEOUT_MS = 400.0  # the original director's shared budget for all producers
CONFIG_KIND = "EndpointPickerConfig"


class SchedulerConfigError(ValueError):
    """The scheduler configuration is invalid; the message names the offending field."""


class _ConfigModel(StrictModel):
    model_config = ConfigDict(frozen=False, populate_by_name=True)


class PluginSpec(_ConfigModel):
    """One plugin instance: its registered type, a unique name (default: the type), its parameters."""

    type: str = Field(min_length=1)
    name: str = ""
    parameters: dict[str, Any] | None = None

    @property
    def effective_name(self) -> str:
        return self.name or self.type


class ProfilePluginRef(_ConfigModel):
    """A plugin used by a profile; ``weight`` only matters for scorers (default 1.0)."""

    plugin_ref: str = Field(alias="pluginRef", min_length=1)
    weight: float | None = Field(None, ge=0, allow_inf_nan=False)


class SchedulingProfileSpec(_ConfigModel):
    name: str = Field(min_length=1)
    plugins: list[ProfilePluginRef] = Field(default_factory=list)


class SchedulerConfig(_ConfigModel):
    """The ``EndpointPickerConfig`` shape (only its scheduling part)."""

    api_version: str | None = Field(None, alias="apiVersion")
    kind: str | None = None
    plugins: list[PluginSpec] = Field(default_factory=list)
    scheduling_profiles: list[SchedulingProfileSpec] = Field(default_factory=list, alias="schedulingProfiles")
    # One budget shared by the data producers of a request; past it, scheduling goes on without them.
    data_producer_timeout_ms: float | None = Field(
        None, alias="dataProducerTimeoutMs", gt=0, allow_inf_nan=False
    )

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str | None) -> str | None:
        if kind is not None and kind != CONFIG_KIND:
            raise ValueError(f"must be {CONFIG_KIND!r}")
        return kind

    @property
    def is_empty(self) -> bool:
        return not self.plugins and not self.scheduling_profiles

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def parse_scheduler_config(
    data: dict[str, Any] | SchedulerConfig, location: str = "scheduler"
) -> SchedulerConfig:
    """Validate the config's shape (not yet its plugins); errors are prefixed with ``location``."""
    if isinstance(data, SchedulerConfig):
        return data
    if not isinstance(data, dict):
        raise SchedulerConfigError(
            f"{location or 'scheduler config'}: must be a mapping, got {type(data).__name__}"
        )
    try:
        return SchedulerConfig.model_validate(data)
    except ValidationError as exc:
        raise SchedulerConfigError(format_validation_error(exc, location)) from None


def load_scheduler_config_file(path: str | Path) -> SchedulerConfig:
    """Read a YAML file holding one ``EndpointPickerConfig``; errors name the file (and line, for YAML)."""
    path = Path(path)
    try:
        data = load_yaml_mapping(path, "scheduler config")
    except YAMLFileError as exc:
        raise SchedulerConfigError(str(exc)) from None
    if data is None:
        raise SchedulerConfigError(f"{path}: the file is empty (omit the file to use the built-in default)")
    try:
        return SchedulerConfig.model_validate(data)
    except ValidationError as exc:
        raise SchedulerConfigError(f"{path}: {format_validation_error(exc, '')}") from None
