"""What the chart renders for each gateway provider and monitoring option, and that it fits the picker as it
runs: the health-checked ports, the scraped port and path, and the scrape's token."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import aiohttp
import pytest
import yaml

from slorouter.config import parse_config
from slorouter.extproc.runtime import EndpointPicker, PickerPorts
from tests.helpers.chart import (
    CASES,
    CRD_DIRS,
    CRDS,
    MATCH,
    NAMESPACE,
    RELEASE,
    SEED_RELEASE,
    VENDORED,
    Render,
    crd_version,
    one,
    render_case,
)

pytestmark = pytest.mark.processes


def _all(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def _named(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [m for m in _all(manifests, kind) if m["metadata"]["name"] == name]
    return found


def _pod(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return one(manifests, "Deployment")["spec"]["template"]


def _epp(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (epp,) = [c for c in _pod(manifests)["spec"]["containers"] if c["name"] == "epp"]
    return epp


def test_gke_renders_the_originals_policies_for_the_inference_pool(render: Render):
    manifests = render_case(render, "seed")
    pool_ref = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": SEED_RELEASE}
    assert one(manifests, "InferencePool")["metadata"]["name"] == SEED_RELEASE
    health = one(manifests, "HealthCheckPolicy")
    assert health["metadata"]["name"] == SEED_RELEASE
    # The model servers' health: vLLM's /health on the pool's (first) target port, every 2 s.
    assert health["spec"] == {
        "targetRef": pool_ref,
        "default": {
            "timeoutSec": 2,
            "checkIntervalSec": 2,
            "config": {
                "type": "HTTP",
                "httpHealthCheck": {
                    "portSpecification": "USE_FIXED_PORT",
                    "port": 8000,
                    "requestPath": "/health",
                },
            },
        },
    }
    backend = one(manifests, "GCPBackendPolicy")
    assert backend["metadata"]["name"] == SEED_RELEASE
    assert backend["spec"] == {
        "targetRef": pool_ref,
        "default": {"timeoutSec": 300, "logging": {"enabled": True}},
    }


def test_gke_policies_follow_the_pool_name_and_its_first_target_port(render: Render):
    manifests = render(
        {
            MATCH: "vllm",
            "provider.name": "gke",
            "inferencePool.name": "chat-pool",
            "inferencePool.targetPorts[0].number": "8200",
            "inferencePool.targetPorts[1].number": "8201",
        }
    )
    for kind in ("HealthCheckPolicy", "GCPBackendPolicy"):
        policy = one(manifests, kind)
        assert policy["metadata"]["name"] == "chat-pool"
        assert policy["spec"]["targetRef"]["name"] == one(manifests, "InferencePool")["metadata"]["name"]
    check = one(manifests, "HealthCheckPolicy")["spec"]["default"]["config"]["httpHealthCheck"]
    assert check["port"] == 8200


def test_gke_health_checks_the_picker_itself_only_off_the_default_port(render: Render):
    assert len(_all(render_case(render, "gke"), "HealthCheckPolicy")) == 1  # GKE's own default: gRPC on 9003
    manifests = render_case(render, "gke-autopilot-prometheus")  # grpcHealthPort 9013
    picker = _named(manifests, "HealthCheckPolicy", f"{RELEASE}-epp")
    service = one(manifests, "Service")
    assert picker["spec"]["targetRef"] == {
        "group": "",
        "kind": "Service",
        "name": service["metadata"]["name"],
    }
    assert picker["spec"]["default"] == {
        "config": {"type": "GRPC", "grpcHealthCheck": {"portSpecification": "USE_FIXED_PORT", "port": 9013}}
    }
    epp = _epp(manifests)
    assert {"name": "grpc-health", "containerPort": 9013} in epp["ports"]
    assert epp["args"][epp["args"].index("--grpc-health-port") + 1] == "9013"


def _rules(crd: dict[str, Any], *path: str) -> set[str]:
    node = crd["schema"]["openAPIV3Schema"]
    for key in path:
        node = node["properties"][key]
    return {rule["rule"] for rule in node.get("x-kubernetes-validations", [])}


@pytest.mark.parametrize("case", ["seed", "gke-autopilot-prometheus"])
def test_gke_health_checks_meet_the_crds_cel_rules(render: Render, case):
    """jsonschema does not run a CRD's CEL rules: the HealthCheckPolicy's that the chart's fields meet,
    restated (the port rule rejects the original's policy, which sets a port without portSpecification)."""
    crd = crd_version("networking.gke.io", "HealthCheckPolicy", "v1")
    port_rules = {
        "self.portSpecification == 'USE_FIXED_PORT' ? has(self.port) && !has(self.portName) : true",
        "self.portSpecification == 'USE_SERVING_PORT' || !has(self.portSpecification) ? "
        "!has(self.port) && !has(self.portName) : true",
    }
    for check in ("httpHealthCheck", "grpcHealthCheck"):
        assert port_rules <= _rules(crd, "spec", "default", "config", check)
    assert (
        "has(self.checkIntervalSec) && has(self.timeoutSec) ? self.checkIntervalSec >= self.timeoutSec : true"
        in _rules(crd, "spec", "default")
    )
    for policy in _all(render_case(render, case), "HealthCheckPolicy"):
        default = policy["spec"]["default"]
        assert default.get("checkIntervalSec", 5) >= default.get("timeoutSec", 5)
        config = default["config"]
        check = config[{"HTTP": "httpHealthCheck", "GRPC": "grpcHealthCheck"}[config["type"]]]
        assert check["portSpecification"] == "USE_FIXED_PORT" and "port" in check and "portName" not in check


def test_istio_destination_rule_speaks_plaintext_to_the_picker_service(render: Render):
    manifests = render_case(render, "istio")
    rule = one(manifests, "DestinationRule")
    service = one(manifests, "Service")
    assert rule["metadata"]["name"] == service["metadata"]["name"]
    assert rule["spec"] == {
        "host": f"{RELEASE}-epp.{NAMESPACE}.svc.cluster.local",
        "trafficPolicy": {
            "tls": {"mode": "DISABLE"},
            "connectionPool": {"http": {"maxRequestsPerConnection": 256000}},
        },
    }
    # The picker serves gRPC without TLS on the port the DestinationRule's host is reached on.
    (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc-ext-proc"]
    assert grpc["appProtocol"] == "kubernetes.io/h2c"
    assert one(manifests, "InferencePool")["spec"]["endpointPickerRef"]["port"]["number"] == grpc["port"]


def test_istio_host_and_tls_can_be_set(render: Render):
    prefix = "provider.istio.destinationRule"
    manifests = render(
        {
            "provider.name": "istio",
            f"{prefix}.host": "picker.inference.svc.example.internal",
            f"{prefix}.trafficPolicy.tls.mode": "ISTIO_MUTUAL",
        }
    )
    rule = one(manifests, "DestinationRule")
    assert rule["spec"] == {
        "host": "picker.inference.svc.example.internal",
        "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}},
    }


def _reader_objects(manifests: list[dict[str, Any]], release: str, namespace: str) -> str:
    """Checks the scrape token's identity (ServiceAccount, ClusterRole on /metrics, its binding); its name."""
    reader = f"{release}-metrics-reader-sa"
    _named(manifests, "ServiceAccount", reader)
    role = _named(manifests, "ClusterRole", f"{namespace}-{release}-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = _named(manifests, "ClusterRoleBinding", f"{namespace}-{release}-metrics-reader-role-binding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": reader, "namespace": namespace}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    return reader


def _token_secret(manifests: list[dict[str, Any]], name: str, reader: str) -> None:
    secret = _named(manifests, "Secret", name)
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": reader}
    assert "data" not in secret  # filled by Kubernetes' token controller


@pytest.mark.parametrize(
    ("case", "gmp_namespace"), [("seed", "gmp-system"), ("gke-autopilot-prometheus", "gke-gmp-system")]
)
def test_managed_prometheus_scrapes_the_pickers_metrics_port_with_a_token(
    render: Render, case, gmp_namespace
):
    manifests = render_case(render, case)
    release, namespace = CASES[case].release, CASES[case].namespace or "default"
    monitoring = one(manifests, "PodMonitoring")
    assert monitoring["metadata"]["name"] == release
    pod = _pod(manifests)
    assert monitoring["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    secret_name = f"{release}-metrics-reader-secret"
    (endpoint,) = monitoring["spec"]["endpoints"]
    assert endpoint == {
        "port": "metrics",
        "scheme": "http",
        "path": "/metrics",
        "interval": "10s",
        "authorization": {"type": "Bearer", "credentials": {"secret": {"name": secret_name, "key": "token"}}},
    }
    # The named port is the picker's --metrics-port.
    epp = _epp(manifests)
    (port,) = [p for p in epp["ports"] if p["name"] == endpoint["port"]]
    assert str(port["containerPort"]) == epp["args"][epp["args"].index("--metrics-port") + 1]
    reader = _reader_objects(manifests, release, namespace)
    _token_secret(manifests, secret_name, reader)
    # Managed Prometheus' collector may read that Secret, and only it.
    role = _named(manifests, "Role", f"{release}-metrics-reader-secret-read")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [secret_name],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = _named(
        manifests,
        "RoleBinding",
        f"{gmp_namespace}:collector:{namespace}-{release}-metrics-reader-secret-read",
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "collector", "namespace": gmp_namespace}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert not _all(manifests, "ServiceMonitor")  # on GKE the original scrapes with managed Prometheus only


def test_prometheus_operator_scrapes_the_picker_service_with_a_token(render: Render):
    manifests = render_case(render, "prometheus")
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["metadata"]["name"] == f"{RELEASE}-epp-monitor"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # extraLabels
    service = one(manifests, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == service["metadata"]["name"]
    (endpoint,) = monitor["spec"]["endpoints"]
    secret_name = "inference-gateway-sa-metrics-reader-secret"  # the original's default
    assert endpoint == {
        "port": "http-metrics",
        "scheme": "http",
        "path": "/metrics",
        "interval": "10s",
        "authorization": {"type": "Bearer", "credentials": {"name": secret_name, "key": "token"}},
    }
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["targetPort"] == "metrics" and port["port"] == 9090
    _token_secret(manifests, secret_name, _reader_objects(manifests, RELEASE, NAMESPACE))
    assert not _all(manifests, "PodMonitoring")


def test_without_auth_the_scrapes_present_no_token(render: Render):
    manifests = render_case(render, "prometheus-no-auth")
    (endpoint,) = one(manifests, "ServiceMonitor")["spec"]["endpoints"]
    assert "authorization" not in endpoint
    assert not _all(manifests, "ClusterRole") and not _all(manifests, "Secret")
    gke = render(
        {
            "provider.name": "gke",
            "inferenceExtension.monitoring.gke.enabled": "true",
            "inferenceExtension.monitoring.prometheus.auth.enabled": "false",
            "inferenceExtension.monitoring.interval": "30s",
        }
    )
    (endpoint,) = one(gke, "PodMonitoring")["spec"]["endpoints"]
    assert "authorization" not in endpoint and endpoint["interval"] == "30s"
    assert {m["kind"] for m in gke} & {"Secret", "ClusterRole", "Role"} == {"Role"}  # the picker's own Role


def test_both_scrapes_share_one_reader_identity(render: Render):
    manifests = render_case(render, "gke-monitoring-istio")
    reader = _reader_objects(manifests, RELEASE, NAMESPACE)
    secrets = {m["metadata"]["name"] for m in _all(manifests, "Secret")}
    assert secrets == {f"{RELEASE}-metrics-reader-secret", "inference-gateway-sa-metrics-reader-secret"}
    for name in secrets:
        _token_secret(manifests, name, reader)
    same = render(
        {
            **CASES["gke-monitoring-istio"].values,
            "inferenceExtension.monitoring.prometheus.auth.secretName": f"{RELEASE}-metrics-reader-secret",
        }
    )
    assert [m["metadata"]["name"] for m in _all(same, "Secret")] == [f"{RELEASE}-metrics-reader-secret"]


def test_monitoring_gke_works_with_any_provider(render: Render):
    for provider in ("none", "istio"):
        manifests = render({"provider.name": provider, "inferenceExtension.monitoring.gke.enabled": "true"})
        assert one(manifests, "PodMonitoring")
        assert not _all(manifests, "HealthCheckPolicy")


async def test_the_scrape_works_against_the_picker_as_it_serves_metrics(render: Render):
    """The picker's /metrics answers the scrape as configured (plain HTTP, the token sent or not: the
    picker does not check it). The chart's router config, with static endpoints for the API server."""
    manifests = render_case(render, "seed")
    data = yaml.safe_load(one(manifests, "ConfigMap")["data"]["config.yaml"])
    data["pool"] = {"endpoints": ["127.0.0.1:9"], "scrape_interval_ms": 1000}
    data.pop("predictor")
    picker = EndpointPicker.build(parse_config(data), PickerPorts("127.0.0.1", 0, 0, 0))
    await picker.start()
    try:
        assert picker.bound is not None
        (endpoint,) = one(manifests, "PodMonitoring")["spec"]["endpoints"]
        url = f"{endpoint['scheme']}://127.0.0.1:{picker.bound.metrics_port}{endpoint['path']}"
        token = base64.b64encode(b"a-service-account-token").decode()
        async with aiohttp.ClientSession() as session:
            for headers in ({"Authorization": f"Bearer {token}"}, {}):
                async with session.get(url, headers=headers) as response:
                    assert response.status == 200
                    assert response.content_type == "text/plain"
                    assert "slorouter_" in await response.text()
    finally:
        await picker.stop()


def test_every_crd_copy_is_the_one_its_readme_names():
    """Each CRD file's README names its source and SHA-256; a copy on disk must be exactly that file."""
    for path in CRDS.values():
        readme = ((CRD_DIRS[0] if path.name in VENDORED.values() else path.parent) / "README.md").read_text()
        (row,) = [line for line in readme.splitlines() if f"`{path.name}`" in line]
        if path.is_file():
            assert hashlib.sha256(path.read_bytes()).hexdigest() in row, path
