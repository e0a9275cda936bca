"""helm (put in .cache/helm by deploy/fetch-helm.sh, which `make test` runs), rendering the chart, and
checking what it renders: core objects against the Kubernetes schemas, custom resources against their
CRDs' own schemas."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
from collections.abc import Callable
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
CRD_DIRS = (Path(__file__).resolve().parent / "crds", ROOT.parent / "shared" / "crds")
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


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = Path(os.environ.get("SLOROUTER_HELM", ROOT / ".cache" / "helm" / "helm"))
    if not binary.is_file():
        message = f"no helm at {binary}: `make test` fetches it (deploy/fetch-helm.sh)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must have run the set-up: a missing helm is a failure there
        pytest.skip(message)
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(binary), *args], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result

    return run


def set_flags(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="session")
def render(helm: Callable[..., subprocess.CompletedProcess[str]]) -> Render:
    """`helm template` of the chart, with IMAGE and then `values`; namespace None renders as the seed's
    line does, without one."""

    def run(
        values: dict[str, str] | None = None,
        *files: Path,
        release: str = RELEASE,
        namespace: str | None = NAMESPACE,
    ) -> list[dict[str, Any]]:
        options = [arg for path in files for arg in ("--values", str(path))]
        options += set_flags({**IMAGE, **(values or {})})
        if namespace is not None:
            options += ["--namespace", namespace]
        out = helm("template", release, str(CHART), *options)
        return [doc for doc in yaml.safe_load_all(out.stdout) if doc]

    return run


def one(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} manifests"
    return found[0]
