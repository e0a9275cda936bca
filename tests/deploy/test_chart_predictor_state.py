"""The predictor sidecars' token and models: the drawn token read back from the cluster (Helm's `lookup`,
against an in-test API server), a pinned token, and the models and sample window on a claim."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.chart import CHART, IMAGE, NAMESPACE, RELEASE, Render, one, set_flags, validate

pytestmark = pytest.mark.processes

LP = "inferenceExtension.latencyPredictor"
PREDICTOR = {f"{LP}.enabled": "true"}
SECRET = f"{RELEASE}-epp-predictor-token"
TOKEN = "pinned-0123456789abcdef0123456789abcdef"
STATE_DIR = "/var/lib/slorouter/training"
MODEL_DIR = f"{STATE_DIR}/models"


def _token(manifests: list[dict[str, Any]]) -> str:
    secret = one(manifests, "Secret")
    assert secret["metadata"]["name"] == SECRET
    return base64.b64decode(secret["data"]["token"]).decode()


def _pod(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(manifests, "Deployment")["spec"]["template"])


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def _flag(container: dict[str, Any], flag: str) -> str:
    args = container["args"]
    return str(args[args.index(flag) + 1])


# -- a token of the user's ----------------------------------------------------------------------------------


def test_a_pinned_token_is_the_secrets_on_every_render(render: Render):
    values = {**PREDICTOR, f"{LP}.token": TOKEN}
    first = render(values)
    assert _token(first) == TOKEN
    assert render(values) == first  # `helm template` (GitOps) renders the same objects every time
    for container in _pod(first)["spec"]["containers"]:
        (env,) = [e for e in container["env"] if e["name"] == "SLOROUTER_PREDICTOR_TOKEN"]
        assert env["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "token"}


def test_a_new_pinned_token_restarts_the_pod_and_a_drawn_one_does_not(render: Render):
    def annotations(values: dict[str, str]) -> dict[str, str]:
        return dict(_pod(render({**PREDICTOR, **values}))["metadata"]["annotations"])

    pinned = annotations({f"{LP}.token": TOKEN})
    assert pinned["checksum/predictor-token"] == hashlib.sha256(TOKEN.encode()).hexdigest()
    other = annotations({f"{LP}.token": TOKEN.replace("pinned", "second")})
    assert other["checksum/predictor-token"] != pinned["checksum/predictor-token"]
    # A token drawn on every `helm template` would otherwise roll the pod on every render.
    assert "checksum/predictor-token" not in annotations({})
    assert "checksum/predictor-token" not in annotations({f"{LP}.tokenSecret": "mine"})


# -- the drawn token, read back from the cluster ------------------------------------------------------------


def _resource(name: str, kind: str) -> dict[str, Any]:
    return {"name": name, "singularName": "", "namespaced": True, "kind": kind, "verbs": ["get", "list"]}


# Discovery of the kinds the predictor's release renders (helm maps each manifest to its resource).
DISCOVERY: dict[str, list[dict[str, Any]]] = {
    "v1": [
        _resource("configmaps", "ConfigMap"),
        _resource("secrets", "Secret"),
        _resource("services", "Service"),
        _resource("serviceaccounts", "ServiceAccount"),
        _resource("persistentvolumeclaims", "PersistentVolumeClaim"),
    ],
    "apps/v1": [_resource("deployments", "Deployment")],
    "rbac.authorization.k8s.io/v1": [_resource("roles", "Role"), _resource("rolebindings", "RoleBinding")],
}


class FakeCluster:
    """As much of kube-apiserver as `helm template --dry-run=server` asks of it for this chart: the version,
    discovery, and single objects by path (404 unless stored). `requests` records the paths asked for."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[str] = []

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        self.requests.append(path)
        if path == "/version":
            return 200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0", "platform": "linux/amd64"}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            groups = [
                {
                    "name": gv.split("/")[0],
                    "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                    "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
                }
                for gv in DISCOVERY
                if "/" in gv
            ]
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        group_version = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
        if group_version in DISCOVERY:
            resources = DISCOVERY[group_version]
            return 200, {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources}
        if path in self.objects:
            return 200, self.objects[path]
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound"}

    def store_token_secret(self, token: str) -> None:
        """The Secret an earlier install of the release created, with the ownership marks Helm leaves."""
        self.objects[f"/api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}"] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": SECRET,
                "namespace": NAMESPACE,
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {
                    "meta.helm.sh/release-name": RELEASE,
                    "meta.helm.sh/release-namespace": NAMESPACE,
                },
            },
            "type": "Opaque",
            "data": {"token": base64.b64encode(token.encode()).decode()},
        }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeCluster, Path]]:
    """A FakeCluster on a loopback port, and a kubeconfig naming it."""
    fake = FakeCluster()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = fake.answer(self.path.split("?", 1)[0])
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "fake", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "namespace": NAMESPACE}}],
                "current-context": "fake",
                "users": [],
            }
        )
    )
    try:
        yield fake, kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _render_against(
    helm: Callable[..., Any], kubeconfig: Path, values: dict[str, str]
) -> list[dict[str, Any]]:
    """`helm template --dry-run=server`: the templates run with `lookup` answered by the cluster, as in
    `helm upgrade` (the manifests are validated here, not by the server's OpenAPI documents)."""
    out = helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kubeconfig", str(kubeconfig),
        "--dry-run=server", "--disable-openapi-validation", *set_flags({**IMAGE, **values}),
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def test_the_drawn_token_is_read_back_from_the_cluster(helm, cluster):
    fake, kubeconfig = cluster
    fake.store_token_secret("token-of-the-running-release-0123456789")
    manifests = _render_against(helm, kubeconfig, PREDICTOR)
    assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}" in fake.requests
    assert _token(manifests) == "token-of-the-running-release-0123456789"
    assert _render_against(helm, kubeconfig, PREDICTOR) == manifests
    for manifest in manifests:
        validate(manifest)
    # A pinned token is the Secret's, whatever the cluster holds.
    assert _token(_render_against(helm, kubeconfig, {**PREDICTOR, f"{LP}.token": TOKEN})) == TOKEN


def test_without_a_secret_in_the_cluster_a_token_is_drawn(helm, cluster):
    fake, kubeconfig = cluster
    first = _token(_render_against(helm, kubeconfig, PREDICTOR))
    assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}" in fake.requests
    assert len(first) == 48 and first.isalnum()
    assert _token(_render_against(helm, kubeconfig, PREDICTOR)) != first


# -- the models on a claim ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("storage_class", "expected"), [("", None), ("-", ""), ("fast-ssd", "fast-ssd")])
def test_persistence_puts_the_models_and_the_state_on_the_charts_claim(
    render: Render, storage_class, expected
):
    manifests = render(
        {
            **PREDICTOR,
            f"{LP}.predictionServerCount": "2",
            f"{LP}.persistence.enabled": "true",
            f"{LP}.persistence.size": "5Gi",
            f"{LP}.persistence.storageClass": storage_class,
        }
    )
    for manifest in manifests:
        validate(manifest)
    claim = one(manifests, "PersistentVolumeClaim")
    name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
    assert (name, namespace) == (f"{RELEASE}-epp-predictor", NAMESPACE)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"] == {"requests": {"storage": "5Gi"}}
    assert claim["spec"].get("storageClassName") == expected
    assert ("storageClassName" in claim["spec"]) is (expected is not None)
    _check_state_on_claim(_pod(manifests)["spec"], name)


def test_persistence_on_an_existing_claim_creates_none(render: Render):
    manifests = render(
        {**PREDICTOR, f"{LP}.persistence.enabled": "true", f"{LP}.persistence.existingClaim": "llm-models"}
    )
    assert [m for m in manifests if m["kind"] == "PersistentVolumeClaim"] == []
    _check_state_on_claim(_pod(manifests)["spec"], "llm-models")


def test_without_persistence_the_models_are_on_empty_dirs(render: Render):
    manifests = render({**PREDICTOR, f"{LP}.persistence.size": "5Gi"})
    assert [m for m in manifests if m["kind"] == "PersistentVolumeClaim"] == []
    pod = _pod(manifests)["spec"]
    assert "initContainers" not in pod
    volumes = _by_name(pod["volumes"])
    assert "emptyDir" in volumes["models"] and "emptyDir" in volumes["training-state"]
    assert "predictor-state" not in volumes
    # Persistence means nothing without the predictor.
    assert "PersistentVolumeClaim" not in {m["kind"] for m in render({f"{LP}.persistence.enabled": "true"})}


def _check_state_on_claim(pod: dict[str, Any], claim: str) -> None:
    """The training server's state directory is the claim, its models in models/ there; the prediction
    servers read them from the same claim, read-only; an init container makes models/ first."""
    volumes = _by_name(pod["volumes"])
    assert volumes["predictor-state"]["persistentVolumeClaim"] == {"claimName": claim}
    assert not {"models", "training-state"} & set(volumes)
    containers = _by_name(pod["containers"])
    training = containers["training-server"]
    assert (_flag(training, "--state-dir"), _flag(training, "--model-dir")) == (STATE_DIR, MODEL_DIR)
    assert {"name": "predictor-state", "mountPath": STATE_DIR} in training["volumeMounts"]
    predictions = [c for name, c in containers.items() if name.startswith("prediction-server-")]
    assert predictions
    for server in predictions:
        assert _flag(server, "--model-dir") == MODEL_DIR
        assert {"name": "predictor-state", "mountPath": STATE_DIR, "readOnly": True} in server["volumeMounts"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["mkdir", "-p", MODEL_DIR]
    assert init["volumeMounts"] == [{"name": "predictor-state", "mountPath": STATE_DIR}]
    assert init["image"] == training["image"]
    security = init["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert init["resources"]["requests"]["cpu"] and init["resources"]["requests"]["memory"]
