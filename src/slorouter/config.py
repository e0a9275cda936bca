"""The ``slorouter serve`` configuration file: YAML → validated objects, with errors that name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slorouter.pool.config import PoolConfig
from slorouter.validation import format_validation_error


class ConfigError(ValueError):
    """A configuration problem, with a message that names the offending key."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GatewayConfig(StrictModel):
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, description="larger bodies get 413")
    api_keys: list[str] = Field(default_factory=list, description="if set, Authorization: Bearer is checked")
    connect_timeout_s: float = Field(default=5.0, gt=0)
    upstream_timeout_s: float = Field(default=600.0, gt=0, description="whole upstream response")
    retry_on_upstream_failure: bool = True


class Config(StrictModel):
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    pool: PoolConfig | None = None
    scheduler: dict[str, Any] | None = Field(
        default=None, description="EndpointPickerConfig: plugins and schedulingProfiles"
    )
    seed: int | None = Field(default=None, description="seeds the scheduler's RNG (random pickers)")


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
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_config(data, str(path))
