"""The Helm chart: lint, render, and check every manifest against the Kubernetes schemas and every custom
resource against its CRD, the seed's install line, and the router config it writes."""

from __future__ import annotations

import base64
import copy
import json
import shlex
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from slorouter.config import TuningConfig, TuningGuardConfig, parse_config
from slorouter.flowcontrol.config import (
    BandLimitsConfig,
    FlowControlConfig,
    PriorityBandConfig,
    SaturationDetectorConfig,
)
from slorouter.gateway.runtime import Router
from slorouter.tracing.config import SamplingConfig, TracingConfig
from tests.helpers.chart import (
    BASE,
    CASES,
    CHART,
    CLUSTER_SCOPED,
    CRDS,
    FC,
    IMAGE,
    LP,
    LP_PATH,
    NAMESPACE,
    PREDICTION,
    RELEASE,
    SEED_LINE,
    SEED_RELEASE,
    Render,
    one,
    render_case,
    set_flags,
    validate,
)

pytestmark = pytest.mark.processes


@pytest.fixture(autouse=True)
def pod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the epp container's environment holds (from the token Secret) when it reads its config."""
    monkeypatch.setenv("SLOROUTER_PREDICTOR_TOKEN", "token-from-the-secret")


def test_the_seed_line_stops_at_the_image_and_renders_with_it(helm):
    """The seed's words (`upgrade --install` → `template`): without an image (none is published) rendering
    stops, naming the values to set and the build step; with one it lints and renders."""
    words = shlex.split(SEED_LINE.replace("\\\n", " "))
    args = [str(CHART) if word == "deploy/helm/slorouter" else word for word in words[3:]]
    result = helm("template", *args, check=False)
    assert result.returncode != 0
    assert "inferenceExtension.image.repository is not set: no slorouter image is published" in result.stderr
    assert "inferenceExtension.image.registry, inferenceExtension.image.repository and" in result.stderr
    assert 'docs/deploy.md, "Installing, step by step", step 1' in result.stderr
    args += set_flags(IMAGE)
    assert "0 chart(s) failed" in helm("lint", "--strict", *args[1:]).stdout
    manifests = [doc for doc in yaml.safe_load_all(helm("template", *args).stdout) if doc]
    assert sorted(m["kind"] for m in manifests) == sorted((*BASE, *CASES["seed"].kinds))
    for manifest in manifests:
        validate(manifest)


@pytest.mark.parametrize("case", CASES)
def test_lint_strict(helm, case):
    options = [] if CASES[case].namespace is None else ["--namespace", NAMESPACE]
    result = helm("lint", "--strict", str(CHART), *options, *set_flags({**IMAGE, **CASES[case].values}))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("case", CASES)
def test_every_manifest_is_valid(render: Render, case):
    manifests = render_case(render, case)
    assert sorted(m["kind"] for m in manifests) == sorted((*BASE, *CASES[case].kinds))
    names = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    assert len(set(names)) == len(names), names
    namespace = CASES[case].namespace or "default"
    missing: set[str] = set()
    for manifest in manifests:
        try:
            validate(manifest)
        except pytest.skip.Exception as skip:  # a third-party CRD absent: the rest is validated all the same
            missing.add(str(skip))
        if manifest["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in manifest["metadata"]
        else:
            assert manifest["metadata"]["namespace"] == namespace
    if missing:
        pytest.skip("; ".join(sorted(missing)))


def test_every_custom_resource_the_chart_renders_has_its_crd(render: Render):
    core_groups = {"", "apps", "rbac.authorization.k8s.io"}
    rendered = {
        (m["apiVersion"].rpartition("/")[0], m["kind"]) for case in CASES for m in render_case(render, case)
    }
    assert {kind for kind in rendered if kind[0] not in core_groups} == set(CRDS)


def test_the_checks_catch_invalid_manifests(render: Render):
    manifests = render_case(render, "inference-pool")
    deployment = copy.deepcopy(one(manifests, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    pool = copy.deepcopy(one(manifests, "InferencePool"))
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)
    pool["spec"]["targetPorts"] = [{"number": 8000, "name": "http"}]
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)
    seed = render_case(render, "seed")
    breakages: list[tuple[str, Any]] = [
        ("HealthCheckPolicy", lambda m: m["spec"]["default"]["config"].update(type="HTTP3")),
        ("HealthCheckPolicy", lambda m: m["spec"]["default"]["config"]["httpHealthCheck"].update(path="/")),
        ("GCPBackendPolicy", lambda m: m["spec"]["default"].update(timeout=300)),
        ("GCPBackendPolicy", lambda m: m["spec"]["targetRef"].pop("kind")),
        ("PodMonitoring", lambda m: m["spec"]["endpoints"][0].update(bearerTokenSecret={})),
        ("PodMonitoring", lambda m: m["spec"].pop("endpoints")),
    ]
    istio = render_case(render, "istio")
    breakages_istio: list[tuple[str, Any]] = [
        ("DestinationRule", lambda m: m["spec"]["trafficPolicy"]["tls"].update(mode="PLAINTEXT")),
        ("DestinationRule", lambda m: m["spec"]["trafficPolicy"].update(tlsMode="DISABLE")),
    ]
    prometheus = render_case(render, "prometheus")
    breakages_prometheus: list[tuple[str, Any]] = [
        ("ServiceMonitor", lambda m: m["spec"]["endpoints"][0].update(interval="10 seconds")),
        ("ServiceMonitor", lambda m: m["spec"]["endpoints"][0].update(bearerTokenSecretName="x")),
    ]
    for found, broken in [(seed, breakages), (istio, breakages_istio), (prometheus, breakages_prometheus)]:
        for kind, breaks in broken:
            manifest = copy.deepcopy(one(found, kind))
            validate(manifest)
            breaks(manifest)
            with pytest.raises(jsonschema.ValidationError):
                validate(manifest)


def _containers(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]


def _router_config(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one(manifests, "ConfigMap")["data"]["config.yaml"])


def test_the_seed_line_renders_the_picker_with_its_sidecars(render: Render):
    manifests = render_case(render, "seed")
    deployment = one(manifests, "Deployment")
    pod = deployment["spec"]["template"]
    # kubectl get pods -l app=vllm-llama3-8b-instruct-epp
    assert pod["metadata"]["labels"]["app"] == f"{SEED_RELEASE}-epp"
    assert deployment["spec"]["selector"]["matchLabels"]["app"] == f"{SEED_RELEASE}-epp"
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert list(containers) == ["epp", "training-server", "prediction-server-1"]
    assert containers["epp"]["args"] == [
        "epp",
        "--config",
        "/etc/slorouter/config.yaml",
        "--host",
        "0.0.0.0",
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
    assert pool["metadata"]["name"] == SEED_RELEASE
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


@pytest.mark.parametrize("case", ["default", "predictor-3", "seed", "predictor-persistent"])
def test_every_container_is_probed_non_root_read_only_and_sized(render: Render, case):
    manifests = render_case(render, case)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"]:
        assert container["livenessProbe"] and container["readinessProbe"], container["name"]
        probe_port = (container["readinessProbe"].get("httpGet") or container["readinessProbe"]["grpc"])[
            "port"
        ]
        assert probe_port in {p["containerPort"] for p in container["ports"]}, container["name"]
        # The kubelet probes the pod's address: every server listens on all of the pod's addresses.
        assert container["args"][container["args"].index("--host") + 1] == "0.0.0.0", container["name"]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
        assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


@pytest.mark.parametrize("case", ["predictor-3", "prediction-server-count-3"])
def test_three_prediction_servers_on_consecutive_ports_are_the_routers_remote_predictor(render: Render, case):
    manifests = render_case(render, case)
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


def test_prediction_server_count_wins_over_prediction_servers_count(render: Render):
    lp = "inferenceExtension.latencyPredictor"
    manifests = render(
        {PREDICTION: "true", f"{lp}.predictionServerCount": "2", f"{lp}.predictionServers.count": "5"}
    )
    names = [c["name"] for c in _containers(manifests)]
    assert names == ["epp", "training-server", "prediction-server-1", "prediction-server-2"]
    assert len(_router_config(manifests)["predictor"]["remote"]["prediction_servers"]) == 2


def test_workers_become_the_pickers_workers_flag(render: Render):
    def epp_args(values: dict[str, str]) -> list[str]:
        (deployment,) = [m for m in render(values) if m["kind"] == "Deployment"]
        (epp,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
        return list(epp["args"])

    assert "--workers" not in epp_args({})
    args = epp_args({"inferenceExtension.workers": "4"})
    assert args[args.index("--workers") + 1] == "4"


def test_replicas_find_each_other_through_a_headless_service_to_share_in_flight_counts(render: Render):
    assert not [m for m in render({}) if m["metadata"]["name"].endswith("-peers")]
    manifests = render({"inferenceExtension.replicas": "3", "inferenceExtension.workers": "2"})
    (peers,) = [m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"].endswith("-peers")]
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["publishNotReadyAddresses"] is True  # a starting replica is found at once
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    assert peers["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (epp,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    args = list(epp["args"])
    meta = peers["metadata"]
    assert args[args.index("--replica-peers") + 1] == f"{meta['name']}.{meta['namespace']}.svc"
    assert args[args.index("--replica-port") + 1] == "9004"
    udp = [(p["containerPort"], p["protocol"]) for p in epp["ports"] if p.get("protocol") == "UDP"]
    assert udp == [(9004, "UDP"), (9005, "UDP")]  # one per worker


def test_the_sidecars_and_the_router_share_a_token_from_a_secret(render: Render):
    manifests = render_case(render, "predictor-3")
    secret = one(manifests, "Secret")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    # A fresh token each install (lookup keeps it on upgrade).
    assert render_case(render, "predictor-3") != manifests
    for container in _containers(manifests):
        (env,) = [e for e in container["env"] if e["name"] == "SLOROUTER_PREDICTOR_TOKEN"]
        assert env["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "token"}
    own = render({**CASES["predictor-3"].values, "inferenceExtension.latencyPredictor.tokenSecret": "mine"})
    assert [m for m in own if m["kind"] == "Secret"] == []
    for container in _containers(own):
        (env,) = [e for e in container["env"] if e["name"] == "SLOROUTER_PREDICTOR_TOKEN"]
        assert env["valueFrom"]["secretKeyRef"]["name"] == "mine"


@pytest.mark.parametrize("case", CASES)
def test_the_router_config_is_accepted_by_slorouter(render: Render, case):
    manifests = render_case(render, case)
    config = parse_config(_router_config(manifests), "configmap config.yaml")
    assert config.pool is not None and config.pool.kubernetes is not None
    assert config.pool.kubernetes.namespace == (CASES[case].namespace or "default")
    assert config.pool.kubernetes.inference_pool == CASES[case].release
    assert config.prediction_enabled is (PREDICTION in CASES[case].values)


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


def test_engine_priority_reaches_the_config(render: Render, tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "inferencePool": {"modelServerType": "sglang", "enginePriority": True},
                "inferenceObjectives": [
                    {"name": "batch", "priority": -1, "enginePriority": -10},
                    {"name": "chat", "priority": 5},
                ],
            }
        )
    )
    config = parse_config(_router_config(render({}, values)), "configmap config.yaml")
    assert config.pool is not None and config.pool.engine_priority is not None
    assert config.pool.engine_priority.enabled and config.pool.engine_priority.order is None
    assert config.objective_engine_priorities() == {"batch": -10, "chat": 5}
    ordered = {"inferencePool.modelServerType": "tgi", "inferencePool.enginePriority.order": "lower-first"}
    config = parse_config(_router_config(render(ordered)), "configmap config.yaml")
    assert config.pool is not None and config.pool.engine_priority is not None
    assert config.pool.engine_priority.order == "lower-first"
    assert "engine_priority" not in _router_config(render_case(render, "default"))["pool"]


def test_flow_control_reaches_the_config(render: Render):
    config = parse_config(_router_config(render_case(render, "flow-control")), "configmap config.yaml")
    fc = config.flow_control
    assert config.flow_control_enabled
    assert (fc.max_requests, fc.default_request_ttl_s, fc.poll_interval_s) == (500, 10.0, 0.05)
    assert fc.fairness_policy == "program-aware-fairness"
    assert [(b.priority, b.max_requests) for b in fc.priority_bands] == [(5, 100)]
    assert fc.saturation_detector.max_inflight_requests == 8
    default = parse_config(_router_config(render_case(render, "default")), "configmap config.yaml")
    assert "flowControl" not in _router_config(render_case(render, "default"))
    assert not default.flow_control_enabled
    # The seed's line turns the latency predictor on: its built-in pipeline comes with flow control.
    seed = parse_config(_router_config(render_case(render, "seed")), "configmap config.yaml")
    assert seed.scheduler is None and seed.flow_control_enabled


def test_tracing_reaches_the_config(render: Render):
    manifests = render(
        {
            "inferenceExtension.tracing.enabled": "true",
            "inferenceExtension.tracing.otelExporterEndpoint": "http://otel-collector.monitoring:4317",
            "inferenceExtension.tracing.sampling.samplerArg": "0.25",
        }
    )
    tracing = parse_config(_router_config(manifests), "configmap config.yaml").tracing
    assert tracing.enabled and tracing.otel_exporter_endpoint == "http://otel-collector.monitoring:4317"
    assert tracing.sampling.sampler_arg == 0.25
    assert "tracing" not in _router_config(render_case(render, "default"))


def test_the_tracing_schema_has_the_config_sections_keys():
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    section = schema["properties"]["inferenceExtension"]["properties"]["tracing"]

    def aliases(model: type[BaseModel]) -> set[str]:
        return {field.alias or name for name, field in model.model_fields.items()}

    assert set(section["properties"]) == aliases(TracingConfig)
    assert set(section["properties"]["sampling"]["properties"]) == aliases(SamplingConfig)


def test_the_flow_control_schema_has_the_config_sections_keys():
    """values.schema.json spells out flowControl for clear errors: exactly the keys the router takes."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    section = schema["properties"]["inferenceExtension"]["properties"]["flowControl"]

    def aliases(model: type[BaseModel]) -> set[str]:
        return {field.alias or name for name, field in model.model_fields.items()}

    properties = section["properties"]
    assert set(properties) == aliases(FlowControlConfig)
    assert set(properties["saturationDetector"]["properties"]) == aliases(SaturationDetectorConfig)
    assert set(properties["priorityBands"]["items"]["properties"]) == aliases(PriorityBandConfig)
    assert set(properties["defaultPriorityBand"]["properties"]) == aliases(BandLimitsConfig)


@pytest.mark.parametrize("case", ["default", "seed"])
async def test_the_router_config_builds_a_router(render: Render, case):
    """Beyond the schema: the plugins and the predictor client are built from it (nothing is started)."""
    config = parse_config(_router_config(render_case(render, case)), "configmap config.yaml")
    router = Router.build(config)
    assert router.pool.endpoints == []  # filled by discovery once started
    assert (router.predictor is not None) is (case == "seed")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"provider.name": "aws"}, "at '/provider/name': value must be one of 'none', 'gke', 'istio'"),
        (
            {f"{LP}.predictionServerCount": "0"},
            f"at '{LP_PATH}/predictionServerCount': minimum",
        ),
        ({f"{LP}.predictionServerCount": "17"}, "predictionServerCount': maximum: got 17, want 16"),
        ({f"{LP}.predictionServers.count": "0"}, f"at '{LP_PATH}/predictionServers/count'"),
        ({f"{LP}.predictionServers.volumeSize": "10Gi"}, "additional properties 'volumeSize' not allowed"),
        ({f"{LP}.trainingServer.config.LATENCY_MODEL_TYPE": "xgboost"}, "properties 'config' not allowed"),
        ({f"{LP}.eppEnv.LATENCY_COALESCE_WINDOW_MS": "1"}, "additional properties 'eppEnv' not allowed"),
        ({"inferencePool.modelServerType": "ollama"}, "at '/inferencePool/modelServerType'"),
        ({"inferencePool.enginePriority": "yes"}, "at '/inferencePool/enginePriority': 'oneOf' failed"),
        (
            {"inferencePool.enginePriority": "true", "inferencePool.modelServerType": "tgi"},
            'inferencePool.enginePriority: modelServerType "tgi" takes no request priority',
        ),
        ({"inferenceExtension.failureMode": "Open"}, "at '/inferenceExtension/failureMode'"),
        ({"inferenceExtension.workers": "0"}, "at '/inferenceExtension/workers': minimum"),
        (
            {f"{FC}.maxRequest": "5"},
            "at '/inferenceExtension/flowControl': additional properties 'maxRequest'",
        ),
        ({f"{FC}.maxRequests": "0"}, "at '/inferenceExtension/flowControl/maxRequests': minimum: got 0"),
        (
            {"inferenceExtension.tracing.otelExporterEndpoint": "localhost:4317"},
            "at '/inferenceExtension/tracing/otelExporterEndpoint'",
        ),
        ({f"{FC}.fairnessPolicy": "fifo"}, "flowControl/fairnessPolicy': value must be one of 'round-robin'"),
        ({f"{FC}.defaultRequestTTL": "soon"}, "'soon' does not match pattern"),
        ({f"{FC}.saturationDetector.kvCacheUtilThreshold": "2"}, "kvCacheUtilThreshold': maximum: got 2"),
        ({f"{FC}.priorityBands[0].maxRequests": "3"}, "priorityBands/0': missing property 'priority'"),
        ({"inferenceExtension.workers": "65"}, "at '/inferenceExtension/workers': maximum"),
        ({"inferenceExtension.replicaPort": "0"}, "at '/inferenceExtension/replicaPort': minimum"),
        ({"inferencePool.modelServers.matchLabels.app": "-bad"}, "matchLabels/app"),
        ({"inferenceExtension.monitoring.gke.enable": "true"}, "additional properties 'enable' not allowed"),
        ({"inferenceExtension.monitoring.interval": "10"}, "at '/inferenceExtension/monitoring/interval'"),
        ({"inferenceExtension.monitoring.interval": "ten"}, "'ten' does not match pattern"),
        ({"inferenceExtension.monitoring.prometheus.auth.secretName": "Bad_Name"}, "auth/secretName'"),
        (
            {"provider.istio.destinationRule.trafficPolicy.tls.mode": "PLAINTEXT"},
            "tls/mode': value must be one of 'DISABLE', 'SIMPLE', 'MUTUAL', 'ISTIO_MUTUAL'",
        ),
        ({"provider.gke.preferredBackends.enabled": "true"}, "additional properties 'preferredBackends' not"),
        ({"inferenceExtension.pluginsCustomConfig.x\\.yaml": "a: 1"}, 'has no entry "default-plugins.yaml"'),
        (
            {PREDICTION: "true", f"{LP}.trainingServer.livenessProbe.httpGet.port": "9000"},
            "livenessProbe.httpGet.port is 9000, but the training server listens on trainingServer.port 8000",
        ),
        ({f"{LP}.token": "too-short"}, f"at '{LP_PATH}/token': minLength: got 9, want 16"),
        ({f"{LP}.token": "sixteen chars ok"}, f"at '{LP_PATH}/token': 'not' failed"),  # a space
        (
            {PREDICTION: "true", f"{LP}.token": "a" * 16, f"{LP}.tokenSecret": "mine"},
            "give token (the chart's Secret holds it) or tokenSecret (a Secret of your own), not both",
        ),
        (
            {PREDICTION: "true", f"{LP}.persistence.existingClaim": "models"},
            "persistence.existingClaim is set but persistence.enabled is false",
        ),
        (
            {PREDICTION: "true", f"{LP}.persistence.enabled": "true", "inferenceExtension.replicas": "2"},
            "one claim holds one training server's state, and replicas is 2",
        ),
        ({f"{LP}.persistence.size": "1 GB"}, f"at '{LP_PATH}/persistence/size'"),
        ({f"{LP}.persistence.existingClaim": "My_Claim"}, f"at '{LP_PATH}/persistence/existingClaim'"),
        ({f"{LP}.persistence.accessModes[0]": "RWX"}, "additional properties 'accessModes' not allowed"),
    ],
)
def test_values_the_chart_cannot_honour_are_errors(helm, values, message):
    result = helm("template", RELEASE, str(CHART), *set_flags({**IMAGE, **values}), check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_the_templates_check_values_even_without_the_schema(helm):
    for values, message in [
        ({"provider.name": "aws"}, 'provider.name must be none, gke or istio, not "aws"'),
        ({"inferencePool.apiVersion": "inference.networking.x-k8s.io/v1alpha2"}, "only inference.networking"),
        (
            {PREDICTION: "true", f"{LP}.predictionServerCount": "0"},
            "predictionServerCount (or predictionServers",
        ),
        ({"inferenceExtension.image.repository": ""}, "inferenceExtension.image.repository is not set"),
    ]:
        result = helm(
            "template",
            RELEASE,
            str(CHART),
            "--skip-schema-validation",
            *set_flags({**IMAGE, **values}),
            check=False,
        )
        assert result.returncode != 0 and message in result.stderr, result.stderr


def test_every_metric_preset_is_a_model_server_type(helm, render: Render):
    from slorouter.pool.dialects import PRESETS

    for name in PRESETS:
        values = {**IMAGE, "inferencePool.modelServerType": name}
        result = helm("template", RELEASE, str(CHART), *set_flags(values))
        assert result.returncode == 0, result.stderr
        # ... which the router reads its pods' metrics in.
        config = parse_config(_router_config(render({"inferencePool.modelServerType": name})), "config.yaml")
        assert config.pool is not None and config.pool.model_server_type == name
    result = helm(
        "template", RELEASE, str(CHART), "--skip-schema-validation",
        *set_flags({**IMAGE, "inferencePool.modelServerType": "ollama"}), check=False,
    )  # fmt: skip
    assert result.returncode != 0 and 'llamacpp and tgi metrics, not "ollama"' in result.stderr


def test_tuning_reaches_the_config(render: Render):
    manifests = render(
        {"inferenceExtension.tuning.enabled": "true", "inferenceExtension.tuning.interval_s": "300"}
    )
    tuning = parse_config(_router_config(manifests), "configmap config.yaml").tuning
    assert tuning.enabled and tuning.interval_s == 300
    assert "tuning" not in _router_config(render_case(render, "default"))


def test_the_tuning_schema_has_the_config_sections_keys():
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    section = schema["properties"]["inferenceExtension"]["properties"]["tuning"]

    def aliases(model: type[BaseModel]) -> set[str]:
        return {field.alias or name for name, field in model.model_fields.items()}

    assert set(section["properties"]) == aliases(TuningConfig)
    assert set(section["properties"]["guard"]["properties"]) == aliases(TuningGuardConfig)
