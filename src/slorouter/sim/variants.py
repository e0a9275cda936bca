"""Engine variants: the ways real model servers differ from a profile's calibrated vLLM pod.

A variant spec is a comma-separated list of items, each a named variant (``decode-priority``,
``slow-prefill``, ...) or ``KEY=VALUE``; ``apply`` turns a profile into the varied one, named
``PROFILE@SPEC``. Items compose left to right: step-time multipliers multiply, every other key takes the
last value given. Keys (docs/simulator.md, "Engine variants"):

- step-time multipliers ``w``, ``lin``, ``attn``, ``kv``, ``req``, ``step`` (one per term of the step-time
  law) and ``time`` (all six);
- ``scheduler=vllm|decode-priority|prefill-priority`` (``slorouter.sim.scheduler``);
- ``batch-tokens=N`` (max_num_batched_tokens), ``max-seqs=N`` (max_num_seqs), ``chunk=N`` (the most prompt
  tokens of one request per step, vLLM's long_prefill_token_threshold);
- ``kv-blocks=N`` or ``kv-memory=F`` (that share of the profile's KV blocks);
- ``metrics-delay-ms=D``, ``metrics-period-ms=P``, ``kv-usage-step=F`` (how late and how coarsely the
  server's /metrics gauges follow the engine);
- ``queue=fcfs|priority`` (vLLM's ``--scheduling-policy``: the waiting queue's order and the preemption
  victim);
- ``stall-every-s=S`` and ``stall-ms=LO:HI`` (pauses, ``slorouter.sim.disruptions``), given together;
- ``slow-factor=F``, ``slow-for-s=D`` and ``slow-every-s=E`` (slow periods), given together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slorouter.sim.profiles import Profile
from slorouter.sim.scheduler import POLICIES

# Step-time multiplier keys, in the order of the law's terms, and the Profile fields they scale.
SCALE_KEYS = ("w", "lin", "attn", "kv", "req", "step")
_SCALED_FIELDS = ("w_ms", "c_lin_ms", "c_attn_ms", "c_kv_ms", "c_req_ms", "c_step_ms")

NAMED_VARIANTS: dict[str, str] = {
    "vllm": "scheduler=vllm",
    "decode-priority": "scheduler=decode-priority",
    "prefill-priority": "scheduler=prefill-priority",
    "slow-prefill": "lin=1.5,attn=1.5",
    "fast-prefill": "lin=0.5,attn=0.5",
    "slow-decode": "w=1.5,kv=1.5,req=1.5,step=1.5",
    "fast-decode": "w=0.5,kv=0.5,req=0.5,step=0.5",
    "small-budget": "batch-tokens=2048",
    "small-chunks": "chunk=512",
    "small-kv": "kv-memory=0.12",
    "slow-gpu": "time=2.2,kv-memory=0.5",
    "late-metrics": "metrics-delay-ms=500",
    "coarse-metrics": "metrics-period-ms=1000,kv-usage-step=0.1",
    "priority-queue": "queue=priority",
    "stalls": "stall-every-s=15,stall-ms=300:3000",
    "slowdowns": "slow-factor=3,slow-for-s=60,slow-every-s=90",
}

# The waiting-queue orders of vLLM's --scheduling-policy.
QUEUES = ("fcfs", "priority")
# Keys that only mean something together.
_TOGETHER = (("stall-every-s", "stall-ms"), ("slow-factor", "slow-for-s", "slow-every-s"))


class VariantError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class EngineVariant:
    """A parsed variant spec. ``label`` is the spec as written; equality ignores it."""

    scale: tuple[float, ...] = (1.0,) * len(SCALE_KEYS)
    scheduler: str | None = None
    batch_tokens: int | None = None
    max_seqs: int | None = None
    chunk: int | None = None
    kv_blocks: int | None = None
    kv_memory: float | None = None
    metrics_delay_ms: float | None = None
    metrics_period_ms: float | None = None
    kv_usage_step: float | None = None
    queue: str | None = None
    stall_every_s: float | None = None
    stall_ms: tuple[float, float] | None = None
    slow_factor: float | None = None
    slow_for_s: float | None = None
    slow_every_s: float | None = None
    label: str = field(default="", compare=False)

    @property
    def is_default(self) -> bool:
        return self == EngineVariant()

    def then(self, other: EngineVariant) -> EngineVariant:
        """This variant, then ``other`` on top: multipliers multiply, settings given in ``other`` win."""
        changes: dict[str, Any] = {
            f.name: getattr(other, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("scale", "label") and getattr(other, f.name) is not None
        }
        if other.kv_blocks is not None:
            changes["kv_memory"] = None
        if other.kv_memory is not None:
            changes["kv_blocks"] = None
        changes["scale"] = tuple(a * b for a, b in zip(self.scale, other.scale, strict=True))
        changes["label"] = ",".join(label for label in (self.label, other.label) if label)
        return dataclasses.replace(self, **changes)

    def spec(self) -> str:
        """The canonical ``KEY=VALUE`` spec (values exact: ``parse_variant(v.spec()) == v``)."""
        items = [f"{key}={value!r}" for key, value in zip(SCALE_KEYS, self.scale, strict=True) if value != 1]
        for key, (attribute, _) in _SETTINGS.items():
            value = getattr(self, attribute)
            if value is None:
                continue
            if isinstance(value, tuple):
                items.append(f"{key}={value[0]!r}:{value[1]!r}")
            else:
                items.append(f"{key}={value}" if isinstance(value, str | int) else f"{key}={value!r}")
        return ",".join(items)

    def apply(self, profile: Profile) -> Profile:
        """``profile`` varied, named ``PROFILE@LABEL``; ``VariantError`` when the result cannot serve."""
        if self.is_default:
            return profile
        label = self.label or self.spec()
        where = f"engine variant {label!r} on {profile.name}"
        for keys in _TOGETHER:
            given = [key for key in keys if getattr(self, _SETTINGS[key][0]) is not None]
            if given and len(given) < len(keys):
                missing = ", ".join(key for key in keys if key not in given)
                raise VariantError(f"{where}: {', '.join(given)} needs {missing} as well")
        changes: dict[str, Any] = {
            name: getattr(profile, name) * factor
            for name, factor in zip(_SCALED_FIELDS, self.scale, strict=True)
            if factor != 1
        }
        for attribute, profile_field in (
            ("scheduler", "scheduler"),
            ("batch_tokens", "max_num_batched_tokens"),
            ("max_seqs", "max_num_seqs"),
            ("chunk", "long_prefill_token_threshold"),
            ("kv_blocks", "num_gpu_blocks"),
            ("metrics_delay_ms", "metrics_delay_ms"),
            ("metrics_period_ms", "metrics_period_ms"),
            ("kv_usage_step", "kv_usage_step"),
            ("queue", "scheduling_policy"),
            ("stall_every_s", "stall_every_s"),
            ("stall_ms", "stall_ms"),
            ("slow_factor", "slow_factor"),
            ("slow_for_s", "slow_for_s"),
            ("slow_every_s", "slow_every_s"),
        ):
            value = getattr(self, attribute)
            if value is not None:
                changes[profile_field] = value
        if self.kv_memory is not None:
            changes["num_gpu_blocks"] = max(1, round(profile.num_gpu_blocks * self.kv_memory))
        varied = dataclasses.replace(profile, name=f"{profile.name}@{label}", **changes)
        if varied.max_num_batched_tokens < varied.max_num_seqs:
            raise VariantError(
                f"{where}: batch-tokens ({varied.max_num_batched_tokens}) must be at least max-seqs "
                f"({varied.max_num_seqs}), so that a step can hold every decode"
            )
        capacity = varied.num_gpu_blocks * varied.block_size
        if capacity < varied.max_model_len:
            raise VariantError(
                f"{where}: a KV cache of {capacity} tokens cannot hold one request of max_model_len "
                f"({varied.max_model_len}); vLLM refuses to start so (use at least "
                f"{-(-varied.max_model_len // varied.block_size)} blocks)"
            )
        return varied


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("must be a finite number > 0")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError("must be a finite number >= 0")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError("must be between 0 and 1")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit():
        raise ValueError("must be a whole number")
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _scheduler(text: str) -> str:
    if text not in POLICIES:
        raise ValueError(f"unknown scheduler (known: {', '.join(POLICIES)})")
    return text


def _queue(text: str) -> str:
    if text not in QUEUES:
        raise ValueError(f"unknown queue (known: {', '.join(QUEUES)})")
    return text


def _range_ms(text: str) -> tuple[float, float]:
    low, sep, high = text.partition(":")
    if not sep:
        raise ValueError("must be LO:HI (milliseconds)")
    values = (_non_negative_float(low), _non_negative_float(high))
    if not values[0] <= values[1] or values[1] == 0:
        raise ValueError("must be LO:HI with 0 <= LO <= HI and HI > 0")
    return values


# KEY -> (EngineVariant attribute, value parser), for the non-multiplier keys.
_SETTINGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "scheduler": ("scheduler", _scheduler),
    "batch-tokens": ("batch_tokens", _positive_int),
    "max-seqs": ("max_seqs", _positive_int),
    "chunk": ("chunk", _positive_int),
    "kv-blocks": ("kv_blocks", _positive_int),
    "kv-memory": ("kv_memory", _positive_float),
    "metrics-delay-ms": ("metrics_delay_ms", _non_negative_float),
    "metrics-period-ms": ("metrics_period_ms", _non_negative_float),
    "kv-usage-step": ("kv_usage_step", _share),
    "queue": ("queue", _queue),
    "stall-every-s": ("stall_every_s", _positive_float),
    "stall-ms": ("stall_ms", _range_ms),
    "slow-factor": ("slow_factor", _positive_float),
    "slow-for-s": ("slow_for_s", _positive_float),
    "slow-every-s": ("slow_every_s", _positive_float),
}
KEYS: tuple[str, ...] = ("time", *SCALE_KEYS, *_SETTINGS)


def _parse_item(spec: str, item: str) -> EngineVariant:
    key, sep, text = item.partition("=")
    key, text = key.strip(), text.strip()
    if not sep:
        named = NAMED_VARIANTS.get(key)
        if named is None:
            raise VariantError(
                f"engine variant {spec!r}: unknown variant {key!r} (named variants: "
                f"{', '.join(NAMED_VARIANTS)}; or KEY=VALUE with KEY one of {', '.join(KEYS)})"
            )
        return dataclasses.replace(parse_variant(named), label=key)
    try:
        if key == "time":
            return EngineVariant(scale=(_positive_float(text),) * len(SCALE_KEYS), label=item)
        if key in SCALE_KEYS:
            scale = [1.0] * len(SCALE_KEYS)
            scale[SCALE_KEYS.index(key)] = _positive_float(text)
            return EngineVariant(scale=tuple(scale), label=item)
        setting = _SETTINGS.get(key)
        if setting is None:
            raise VariantError(f"engine variant {spec!r}: unknown key {key!r} (known: {', '.join(KEYS)})")
        attribute, parse = setting
        return EngineVariant(**{attribute: parse(text)}, label=item)
    except VariantError:
        raise
    except ValueError as exc:
        reason = str(exc) if "must" in str(exc) or "unknown" in str(exc) else "not a number"
        where = f"engine variant {spec!r}" + (f": {item!r}" if item != spec.strip() else "")
        raise VariantError(f"{where}: {reason}") from None


def parse_variant(spec: str) -> EngineVariant:
    """The variant a spec describes (``VariantError`` naming the bad item); an empty spec is the default."""
    variant = EngineVariant()
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            if spec.strip():
                raise VariantError(f"engine variant {spec!r}: empty item between commas")
            continue
        variant = variant.then(_parse_item(spec, "".join(item.split())))
    return dataclasses.replace(
        variant, label=",".join("".join(p.split()) for p in spec.split(",") if p.strip())
    )


def apply_variant(profile: Profile, spec: str) -> Profile:
    """``parse_variant(spec).apply(profile)``."""
    return parse_variant(spec).apply(profile)
