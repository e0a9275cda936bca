"""The Helm chart in tests: its paths, checking what it renders (core objects against the Kubernetes schemas,
custom resources against their CRDs' own schemas), and the cases the chart tests render (values and the
kinds each adds). helm itself and rendering are the fixtures of tests/deploy/conftest.py."""

from __future__ import annotations

import copy
import functools
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "slorouter"
CRD = ROOT / "deploy" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
# The CRDs of the gateway and monitoring products, which install their own: the upstream files, byte for
# byte (crds/README.md names each one's source and SHA-256), looked for in tests/deploy/crds, then in
# the shared/crds folder beside the repository.
CRD_DIRS = (ROOT / "tests" / "deploy" / "crds", ROOT.parent / "shared" / "crds")
VENDORED = {
    ("networking.gke.io", "HealthCheckPolicy"): "networking.gke.io_healthcheckpolicies.yaml",
    ("networking.gke.io", "GCPBackendPolicy"): "networking.gke.io_gcpbackendpolicies.yaml",
    ("networking.istio.io", "DestinationRule"): "networking.istio.io_destinationrules.yaml",
    ("monitoring.googleapis.com", "PodMonitoring"): "monitoring.googleapis.com_podmonitorings.yaml",
    ("monitoring.coreos.com", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}


def vendored_crd(name: str) -> Path:
    """The first copy of CRD file `name` in CRD_DIRS (the first folder's path if there is none)."""
    return next((d / name for d in CRD_DIRS if (d / name).is_file()), CRD_DIRS[0] / name)


CRDS = {("inference.networking.k8s.io", "InferencePool"): CRD} | {
    kind: vendored_crd(name) for kind, name in VENDORED.items()
}
KUBERNETES_VERSION = "1.32.0"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}
RELEASE, NAMESPACE = "llama", "inference"
# No slorouter image is published, so the chart requires one (docs/deploy.md, step 1): `render` and the
# tests' own helm lines set this one unless they say otherwise.
IMAGE = {
    "inferenceExtension.image.registry": "registry.example.test/team",
    "inferenceExtension.image.repository": "slorouter",
}
Render = Callable[..., list[dict[str, Any]]]


def _missing(message: str) -> None:
    # Third-party CRDs are test inputs the repository does not ship (tests/deploy/crds/README.md).
    pytest.skip(message)


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD schema with unknown fields rejected (as `kubectl apply --validate=strict` does)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    # The API server allows these at the root whether the schema names them or not (Istio's do not).
    schema["properties"]["metadata"] = {"type": "object"}
    schema["properties"].setdefault("apiVersion", {"type": "string"})
    schema["properties"].setdefault("kind", {"type": "string"})
    return schema


@functools.cache
def crd_version(group: str, kind: str, version: str) -> dict[str, Any]:
    """The CRD's entry for group/version kind (schema, served, deprecated), or a skip/failure if absent."""
    path = CRDS[(group, kind)]
    if not path.is_file():
        places = " or ".join(str(d) for d in CRD_DIRS)
        _missing(f"no {path.name} (the {kind} CRD) in {places}: tests/deploy/crds/README.md names its source")
    crd = yaml.safe_load(path.read_text())
    assert crd["kind"] == "CustomResourceDefinition", path
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group, kind), path
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return dict(entry)


def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    group, version = api_version.split("/")
    entry = crd_version(group, kind, version)
    assert entry["served"] and not entry.get("deprecated"), (
        f"{api_version} {kind} is not served, or deprecated"
    )
    return strict(entry["schema"]["openAPIV3Schema"])


def validate(manifest: dict[str, Any]) -> None:
    """A custom resource against its CRD's schema (strict), anything else against Kubernetes' (strict)."""
    api_version, kind = manifest["apiVersion"], manifest["kind"]
    group = api_version.rpartition("/")[0]
    if (group, kind) in CRDS:
        jsonschema.validate(manifest, crd_schema(api_version, kind))
    else:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def set_flags(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def one(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} manifests"
    return found[0]


# The GKE guide's install line, verbatim with this chart as <chart>. docs/deploy.md shows it with the image
# values added (tests/deploy/test_deploy_doc.py); the cases here add IMAGE.
SEED_LINE = """\
helm upgrade --install vllm-llama3-8b-instruct deploy/helm/slorouter \\
  --set inferencePool.modelServers.matchLabels.app=vllm-llama3-8b-instruct \\
  --set provider.name=gke \\
  --set inferenceExtension.monitoring.gke.enabled=true \\
  --set inferenceExtension.latencyPredictor.enabled=true
"""


def _seed() -> tuple[str, dict[str, str]]:
    words = shlex.split(SEED_LINE.replace("\\\n", " "))
    assert words[:3] == ["helm", "upgrade", "--install"] and words[4] == "deploy/helm/slorouter"
    flags = words[5:]
    assert flags[::2] == ["--set"] * 4
    return words[3], dict(flag.split("=", 1) for flag in flags[1::2])


SEED_RELEASE, SEED = _seed()

BASE = ("ConfigMap", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount")
POOL = ("InferencePool",)
PREDICTOR = ("Secret",)  # the sidecars' token
READER = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")  # the scrape token's identity
GMP = (*READER, "Secret", "Role", "RoleBinding", "PodMonitoring")
SERVICE_MONITOR = (*READER, "Secret", "ServiceMonitor")
GKE = ("HealthCheckPolicy", "GCPBackendPolicy")
ISTIO = ("DestinationRule",)
PREDICTION = "inferenceExtension.latencyPredictor.enabled"
MATCH = "inferencePool.modelServers.matchLabels.app"
LP = "inferenceExtension.latencyPredictor"
LP_PATH = "/inferenceExtension/latencyPredictor"
ISTIO_POOL = "provider.istio.destinationRule.trafficPolicy.connectionPool"
FC = "inferenceExtension.flowControl"
FLOW_CONTROL = {
    f"{FC}.enabled": "true",
    f"{FC}.maxRequests": "500",
    f"{FC}.defaultRequestTTL": "10s",
    f"{FC}.pollInterval": "0.05",
    f"{FC}.fairnessPolicy": "program-aware-fairness",
    f"{FC}.priorityBands[0].priority": "5",
    f"{FC}.priorityBands[0].maxRequests": "100",
    f"{FC}.saturationDetector.maxInflightRequestsPerEndpoint": "8",
}


@dataclass(frozen=True)
class Case:
    values: dict[str, str]
    kinds: tuple[str, ...]  # what it renders beyond BASE
    release: str = RELEASE
    namespace: str | None = NAMESPACE  # None: no --namespace, as the seed's line


CASES: dict[str, Case] = {
    "default": Case({}, ()),
    "predictor-1": Case({PREDICTION: "true"}, PREDICTOR),
    "predictor-3": Case(
        {PREDICTION: "true", "inferenceExtension.latencyPredictor.predictionServers.count": "3"}, PREDICTOR
    ),
    "prediction-server-count-3": Case(
        {PREDICTION: "true", "inferenceExtension.latencyPredictor.predictionServerCount": "3"}, PREDICTOR
    ),
    "predictor-pinned-token": Case({PREDICTION: "true", f"{LP}.token": "pinned-0123456789abcdef"}, PREDICTOR),
    "predictor-persistent": Case(
        {PREDICTION: "true", f"{LP}.persistence.enabled": "true", f"{LP}.predictionServerCount": "2"},
        (*PREDICTOR, "PersistentVolumeClaim"),
    ),
    "predictor-existing-claim": Case(
        {
            PREDICTION: "true",
            f"{LP}.persistence.enabled": "true",
            f"{LP}.persistence.existingClaim": "models",
        },
        PREDICTOR,
    ),
    "inference-pool": Case(
        {
            MATCH: "vllm",
            "inferencePool.targetPorts[0].number": "8000",
            "inferencePool.targetPorts[1].number": "8001",
            "inferenceExtension.failureMode": "FailClose",
        },
        POOL,
    ),
    "seed": Case(SEED, (*POOL, *PREDICTOR, *GKE, *GMP), release=SEED_RELEASE, namespace=None),
    "gke": Case({MATCH: "vllm", "provider.name": "gke"}, (*POOL, *GKE)),
    "gke-autopilot-prometheus": Case(
        {
            MATCH: "vllm",
            "provider.name": "gke",
            "provider.gke.autopilot": "true",
            "inferenceExtension.monitoring.prometheus.enabled": "true",
            "inferenceExtension.grpcHealthPort": "9013",
        },
        (*POOL, *GKE, "HealthCheckPolicy", *GMP),
    ),
    "istio": Case(
        {
            MATCH: "vllm",
            "provider.name": "istio",
            f"{ISTIO_POOL}.http.maxRequestsPerConnection": "256000",
        },
        (*POOL, *ISTIO),
    ),
    "prometheus": Case(
        {
            "inferenceExtension.monitoring.prometheus.enabled": "true",
            "inferenceExtension.monitoring.prometheus.extraLabels.release": "kube-prometheus-stack",
        },
        SERVICE_MONITOR,
    ),
    "prometheus-no-auth": Case(
        {
            "inferenceExtension.monitoring.prometheus.enabled": "true",
            "inferenceExtension.monitoring.prometheus.auth.enabled": "false",
        },
        ("ServiceMonitor",),
    ),
    "flow-control": Case(FLOW_CONTROL, ()),
    "replicas": Case({"inferenceExtension.replicas": "3", "inferenceExtension.workers": "2"}, ("Service",)),
    "gke-monitoring-istio": Case(
        {
            "provider.name": "istio",
            "inferenceExtension.monitoring.gke.enabled": "true",
            "inferenceExtension.monitoring.prometheus.enabled": "true",
        },
        (*ISTIO, *READER, "Secret", "Role", "RoleBinding", "PodMonitoring", "Secret", "ServiceMonitor"),
    ),
}


def render_case(render: Render, name: str) -> list[dict[str, Any]]:
    case = CASES[name]
    return render(case.values, release=case.release, namespace=case.namespace)
