"""The API objects discovery reads, parsed from the API server's JSON into typed views.

Anything that does not have the shape the Kubernetes API promises raises ``ApiObjectError`` with the
object's name and the field at fault, so a malformed object is reported rather than half-read.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

# Annotations discovery reads are under this prefix; the others (often large) are not kept.
ANNOTATION_PREFIX = "slorouter.io/"


class ApiObjectError(ValueError):
    """An object from the API server that does not have the documented shape."""


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    name: str
    namespace: str
    resource_version: str
    labels: dict[str, str] = field(default_factory=dict)
    deleting: bool = False  # metadata.deletionTimestamp is set
    annotations: dict[str, str] = field(default_factory=dict)  # those under ANNOTATION_PREFIX only


@dataclass(frozen=True, slots=True)
class PodView:
    """What discovery needs of a pod: its name, labels, IP and whether it serves."""

    meta: ObjectMeta
    ip: str | None
    ready: bool

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def serving(self) -> bool:
        """Ready, with an IP, and not being deleted: the pod's ports are pool endpoints."""
        return self.ready and self.ip is not None and not self.meta.deleting

    @property
    def state(self) -> str:
        """``serving``, or why not: ``terminating``, ``pending`` (no IP yet) or ``not_ready``."""
        if self.meta.deleting:
            return "terminating"
        if self.ip is None:
            return "pending"
        return "serving" if self.ready else "not_ready"

    def address(self, port: int) -> str:
        assert self.ip is not None
        return f"[{self.ip}]:{port}" if ":" in self.ip else f"{self.ip}:{port}"


@dataclass(frozen=True, slots=True)
class InferencePoolSpec:
    """``inference.networking.k8s.io/v1`` InferencePool: the pods it selects and their ports."""

    meta: ObjectMeta
    match_labels: dict[str, str]
    target_ports: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.meta.name


def _mapping(value: Any, where: str, who: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiObjectError(f"{who}: {where} must be an object, got {type(value).__name__}")
    return value


def _string_map(value: Any, where: str, who: str) -> dict[str, str]:
    if value is None:
        return {}
    mapping = _mapping(value, where, who)
    for key, item in mapping.items():
        if not isinstance(item, str):
            raise ApiObjectError(f"{who}: {where}.{key} must be a string, got {type(item).__name__}")
    return dict(mapping)


def _text(mapping: dict[str, Any], key: str, where: str, who: str) -> str:
    value = mapping.get(key)
    if not isinstance(value, str) or not value:
        raise ApiObjectError(f"{who}: {where}.{key} must be a non-empty string, got {value!r}")
    return value


def parse_meta(obj: Any, kind: str) -> ObjectMeta:
    """``metadata`` of any object; ``kind`` only names it in errors."""
    body = _mapping(obj, "the object", kind)
    meta = _mapping(body.get("metadata"), "metadata", kind)
    name = meta.get("name")
    who = f"{kind} {name!r}" if isinstance(name, str) else kind
    return ObjectMeta(
        name=_text(meta, "name", "metadata", who),
        namespace=_text(meta, "namespace", "metadata", who),
        resource_version=_text(meta, "resourceVersion", "metadata", who),
        labels=_string_map(meta.get("labels"), "metadata.labels", who),
        deleting=meta.get("deletionTimestamp") is not None,
        annotations=_own_annotations(meta.get("annotations"), who),
    )


def _own_annotations(value: Any, who: str) -> dict[str, str]:
    if value is None:
        return {}
    mapping = _mapping(value, "metadata.annotations", who)
    own = {key: item for key, item in mapping.items() if str(key).startswith(ANNOTATION_PREFIX)}
    return _string_map(own, "metadata.annotations", who)


def parse_pod(obj: Any) -> PodView:
    meta = parse_meta(obj, "Pod")
    who = f"Pod {meta.namespace}/{meta.name}"
    status = obj.get("status")
    if status is None:  # a pod not yet seen by the scheduler
        return PodView(meta, None, False)
    status = _mapping(status, "status", who)
    ip = status.get("podIP")
    if ip in (None, ""):
        ip = None
    elif not isinstance(ip, str):
        raise ApiObjectError(f"{who}: status.podIP must be a string, got {type(ip).__name__}")
    else:
        try:
            ip = str(ipaddress.ip_address(ip))
        except ValueError:
            raise ApiObjectError(f"{who}: status.podIP {ip!r} is not an IP address") from None
    conditions = status.get("conditions")
    if conditions is None:
        conditions = []
    if not isinstance(conditions, list):
        raise ApiObjectError(f"{who}: status.conditions must be a list, got {type(conditions).__name__}")
    ready = False
    for i, condition in enumerate(conditions):
        condition = _mapping(condition, f"status.conditions[{i}]", who)
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    return PodView(meta, ip, ready and status.get("phase") == "Running")


def parse_inference_pool(obj: Any) -> InferencePoolSpec:
    meta = parse_meta(obj, "InferencePool")
    who = f"InferencePool {meta.namespace}/{meta.name}"
    spec = _mapping(obj.get("spec"), "spec", who)
    selector = _mapping(spec.get("selector"), "spec.selector", who)
    match_labels = _string_map(selector.get("matchLabels"), "spec.selector.matchLabels", who)
    if not match_labels:
        raise ApiObjectError(f"{who}: spec.selector.matchLabels is empty (it would select every pod)")
    ports_field = spec.get("targetPorts")
    if not isinstance(ports_field, list) or not ports_field:
        raise ApiObjectError(f"{who}: spec.targetPorts must be a non-empty list, got {ports_field!r}")
    ports: list[int] = []
    for i, item in enumerate(ports_field):
        number = _mapping(item, f"spec.targetPorts[{i}]", who).get("number")
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
            raise ApiObjectError(
                f"{who}: spec.targetPorts[{i}].number must be a port in 1-65535, got {number!r}"
            )
        if number in ports:
            raise ApiObjectError(f"{who}: spec.targetPorts lists port {number} twice")
        ports.append(number)
    return InferencePoolSpec(meta, match_labels, tuple(ports))
