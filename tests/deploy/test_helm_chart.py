"""The Helm chart: lint, render, and check every manifest against the Kubernetes schemas (and the
InferencePool against its CRD), the seed's install line, and the router config it writes."""

from __future__ import annotations

import base64
import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from slorouter.config import parse_config
from slorouter.gateway.runtime import Router
from tests.deploy.conftest import CHART, CRD, NAMESPACE, RELEASE, Render, one, set_flags

KUBERNETES_VERSION = "1.32.0"
SEED = {  # the seed's `helm upgrade --install` line (docs/deploy.md)
    "inferencePool.modelServers.matchLabels.app": "vllm-llama3-8b-instruct",
    "inferenceExtension.latencyPredictor.enabled": "true",
}
CASES: dict[str, dict[str, str]] = {
    "default": {},
    "predictor-1": {"inferenceExtension.latencyPredictor.enabled": "true"},
    "predictor-3": {
        "inferenceExtension.latencyPredictor.enabled": "true",
        "inferenceExtension.latencyPredictor.predictionServers.count": "3",
    },
    "inference-pool": {
        "inferencePool.modelServers.matchLabels.app": "vllm",
        "inferencePool.targetPorts[0].number": "8000",
        "inferencePool.targetPorts[1].number": "8001",
        "inferenceExtension.failureMode": "FailClose",
    },
    "seed": SEED,
}


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD schema with unknown fields rejected (as `kubectl apply --validate=strict` does)."""
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
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


@pytest.fixture(scope="module")
def inference_pool_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert version["served"] and version["storage"]
    return _strict(version["schema"]["openAPIV3Schema"])


@pytest.fixture(autouse=True)
def pod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the epp container's environment holds (from the token Secret) when it reads its config."""
    monkeypatch.setenv("SLOROUTER_PREDICTOR_TOKEN", "token-from-the-secret")


@pytest.mark.parametrize("case", CASES)
def test_lint_strict(helm, case):
    result = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *set_flags(CASES[case]))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("case", CASES)
def test_every_manifest_is_valid(render: Render, inference_pool_schema, case):
    manifests = render(CASES[case])
    kinds = sorted(m["kind"] for m in manifests)
    expected = ["ConfigMap", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    if "inferencePool.modelServers.matchLabels.app" in CASES[case]:
        expected.append("InferencePool")
    if "inferenceExtension.latencyPredictor.enabled" in CASES[case]:
        expected.append("Secret")  # the sidecars' token
    assert kinds == sorted(expected)
    for manifest in manifests:
        if manifest["kind"] == "InferencePool":
            jsonschema.validate(manifest, inference_pool_schema)
        else:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        assert manifest["metadata"]["namespace"] == NAMESPACE


def test_the_checks_catch_invalid_manifests(render: Render, inference_pool_schema):
    manifests = render(CASES["inference-pool"])
    deployment = copy.deepcopy(one(manifests, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    pool = copy.deepcopy(one(manifests, "InferencePool"))
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, inference_pool_schema)
    pool["spec"]["targetPorts"] = [{"number": 8000, "name": "http"}]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, inference_pool_schema)


def _containers(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]


def _router_config(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one(manifests, "ConfigMap")["data"]["config.yaml"])


def test_the_seed_line_renders_the_picker_with_its_sidecars(render: Render):
    manifests = render(SEED)
    deployment = one(manifests, "Deployment")
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["app"] == f"{RELEASE}-epp"  # kubectl get pods -l app=llama-epp
    assert deployment["spec"]["selector"]["matchLabels"]["app"] == f"{RELEASE}-epp"
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert list(containers) == ["epp", "training-server", "prediction-server-1"]
    assert containers["epp"]["args"] == [
        "epp",
        "--config",
        "/etc/slorouter/config.yaml",
        "--grpc-port",
        "9002",
        "--grpc-health-port",
        "9003",
        "--metrics-port",
        "9090",
    ]
    assert containers["epp"]["readinessProbe"]["grpc"] == {
        "port": 9003,
        "service": "envoy.service.ext_proc.v3.ExternalProcessor",
    }
    assert containers["training-server"]["args"][:2] == ["predictor", "training-server"]
    assert containers["prediction-server-1"]["args"][:2] == ["predictor", "prediction-server"]
    # The predictor servers share the model volume: written by one, read by the others.
    mounts = {name: {m["name"]: m for m in c["volumeMounts"]} for name, c in containers.items()}
    assert not mounts["training-server"]["models"].get("readOnly")
    assert mounts["prediction-server-1"]["models"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "emptyDir" in volumes["models"]
    pool = one(manifests, "InferencePool")
    assert pool["metadata"]["name"] == RELEASE
    assert pool["spec"]["selector"]["matchLabels"] == {"app": "vllm-llama3-8b-instruct"}
    service = one(manifests, "Service")
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": service["metadata"]["name"],
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


@pytest.mark.parametrize("case", ["default", "predictor-3", "seed"])
def test_every_container_is_probed_non_root_read_only_and_sized(render: Render, case):
    manifests = render(CASES[case])
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"]:
        assert container["livenessProbe"] and container["readinessProbe"], container["name"]
        probe_port = (container["readinessProbe"].get("httpGet") or container["readinessProbe"]["grpc"])[
            "port"
        ]
        assert probe_port in {p["containerPort"] for p in container["ports"]}, container["name"]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
        assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_three_prediction_servers_on_consecutive_ports_are_the_routers_remote_predictor(render: Render):
    manifests = render(CASES["predictor-3"])
    containers = _containers(manifests)
    ports = {c["name"]: c["ports"][0]["containerPort"] for c in containers}
    assert ports == {
        "epp": 9002,
        "training-server": 8000,
        "prediction-server-1": 8001,
        "prediction-server-2": 8002,
        "prediction-server-3": 8003,
    }
    config = _router_config(manifests)
    assert config["predictor"]["mode"] == "remote"
    assert config["predictor"]["remote"] == {
        "training_server": "http://127.0.0.1:8000",
        "prediction_servers": [f"http://127.0.0.1:{p}" for p in (8001, 8002, 8003)],
        "token_env": "SLOROUTER_PREDICTOR_TOKEN",
    }


def test_the_sidecars_and_the_router_share_a_token_from_a_secret(render: Render):
    manifests = render(CASES["predictor-3"])
    secret = one(manifests, "Secret")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    assert (
        render(CASES["predictor-3"]) != manifests
    )  # a fresh token each install (lookup keeps it on upgrade)
    for container in _containers(manifests):
        (env,) = [e for e in container["env"] if e["name"] == "SLOROUTER_PREDICTOR_TOKEN"]
        assert env["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "token"}
        if container["name"] != "epp":  # on the pod's address for the kubelet: the token is required
            assert container["args"][container["args"].index("--host") + 1] == "0.0.0.0"
    own = render({**CASES["predictor-3"], "inferenceExtension.latencyPredictor.tokenSecret": "mine"})
    assert [m for m in own if m["kind"] == "Secret"] == []
    for container in _containers(own):
        (env,) = [e for e in container["env"] if e["name"] == "SLOROUTER_PREDICTOR_TOKEN"]
        assert env["valueFrom"]["secretKeyRef"]["name"] == "mine"


@pytest.mark.parametrize("case", CASES)
def test_the_router_config_is_accepted_by_slorouter(render: Render, case):
    manifests = render(CASES[case])
    config = parse_config(_router_config(manifests), "configmap config.yaml")
    assert config.pool is not None and config.pool.kubernetes is not None
    assert config.pool.kubernetes.namespace == NAMESPACE
    assert config.pool.kubernetes.inference_pool == RELEASE
    assert config.prediction_enabled is ("inferenceExtension.latencyPredictor.enabled" in CASES[case])


def test_plugins_objectives_and_router_overrides_reach_the_config(render: Render, tmp_path):
    plugins = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: queue-scorer\n- type: max-score-picker\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: max-score-picker\n"
    )
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "inferenceExtension": {
                    "pluginsCustomConfig": {"default-plugins.yaml": plugins},
                    "routerConfig": {"pool": {"scrape_interval_ms": 100}},
                    "flags": {"log-level": "DEBUG"},
                    "latencyPredictor": {"enabled": True, "remote": {"timeout_ms": 80}},
                },
                "inferenceObjectives": [{"name": "batch", "priority": -1}, {"name": "chat", "priority": 5}],
            }
        )
    )
    manifests = render({}, values)
    config = parse_config(_router_config(manifests), "configmap config.yaml")
    assert config.scheduler == yaml.safe_load(plugins)
    assert config.objective_priorities() == {"batch": -1, "chat": 5}
    assert config.pool is not None and config.pool.scrape_interval_ms == 100
    assert config.pool.kubernetes is not None and config.pool.kubernetes.inference_pool == RELEASE
    assert config.predictor is not None and config.predictor.remote is not None
    assert config.predictor.remote.timeout_ms == 80
    assert _containers(manifests)[0]["args"][-2:] == ["--log-level", "DEBUG"]


@pytest.mark.parametrize("case", ["default", "seed"])
async def test_the_router_config_builds_a_router(render: Render, case):
    """Beyond the schema: the plugins and the predictor client are built from it (nothing is started)."""
    config = parse_config(_router_config(render(CASES[case])), "configmap config.yaml")
    router = Router.build(config)
    assert router.pool.endpoints == []  # filled by discovery once started
    assert (router.predictor is not None) is (case == "seed")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"provider.name": "gke"}, "at '/provider/name': value must be 'none'"),
        (
            {"inferenceExtension.latencyPredictor.predictionServerCount": "3"},
            "additional properties 'predictionServerCount' not allowed",
        ),
        (
            {"inferenceExtension.latencyPredictor.predictionServers.count": "0"},
            "at '/inferenceExtension/latencyPredictor/predictionServers/count'",
        ),
        ({"inferencePool.modelServerType": "triton-tensorrt-llm"}, "at '/inferencePool/modelServerType'"),
        ({"inferenceExtension.failureMode": "Open"}, "at '/inferenceExtension/failureMode'"),
        ({"inferencePool.modelServers.matchLabels.app": "-bad"}, "matchLabels/app"),
        ({"inferenceExtension.monitoring.prometheus.enabled": "true"}, "'monitoring' not allowed"),
        ({"inferenceExtension.pluginsCustomConfig.x\\.yaml": "a: 1"}, 'has no entry "default-plugins.yaml"'),
    ],
)
def test_values_the_chart_cannot_honour_are_errors(helm, values, message):
    result = helm("template", RELEASE, str(CHART), *set_flags(values), check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_the_templates_check_values_even_without_the_schema(helm):
    for values, message in [
        ({"provider.name": "gke"}, 'provider.name: only "none" is supported'),
        ({"inferencePool.apiVersion": "inference.networking.x-k8s.io/v1alpha2"}, "only inference.networking"),
    ]:
        result = helm(
            "template", RELEASE, str(CHART), "--skip-schema-validation", *set_flags(values), check=False
        )
        assert result.returncode != 0 and message in result.stderr, result.stderr
