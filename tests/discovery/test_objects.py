"""Parsing API objects: what a pod's status means for serving, and clear errors for malformed objects."""

from __future__ import annotations

import pytest

from slorouter.discovery.objects import ApiObjectError, parse_inference_pool, parse_pod
from tests.helpers.kube_apiserver import inference_pool, pod


def _stored(obj: dict) -> dict:
    obj["metadata"]["resourceVersion"] = "7"
    return obj


def test_a_ready_running_pod_with_an_ip_serves():
    view = parse_pod(_stored(pod("a", "10.0.0.1", labels={"app": "vllm", "role": "decode"})))
    assert view.serving and view.address(8000) == "10.0.0.1:8000"
    assert view.meta.labels == {"app": "vllm", "role": "decode"}
    assert parse_pod(_stored(pod("b", "fd00::0002"))).address(8000) == "[fd00::2]:8000"


@pytest.mark.parametrize(
    "obj",
    [
        pod("a", "10.0.0.1", ready=False),
        pod("a", None, ready=False, phase="Pending"),
        pod("a", "10.0.0.1", phase="Succeeded"),
        {"metadata": {"name": "a", "namespace": "default"}},  # not yet scheduled: no status
    ],
)
def test_pods_that_do_not_serve(obj):
    assert not parse_pod(_stored(obj)).serving


def test_a_terminating_pod_does_not_serve():
    obj = _stored(pod("a", "10.0.0.1"))
    obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert not parse_pod(obj).serving


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o["status"].update(podIP="10.0.0.256"), "Pod default/a: status.podIP '10.0.0.256' is not"),
        (lambda o: o["status"].update(podIP=5), "status.podIP must be a string"),
        (lambda o: o["status"].update(conditions={}), "status.conditions must be a list"),
        (lambda o: o["metadata"].update(labels={"app": 1}), "metadata.labels.app must be a string"),
        (lambda o: o["metadata"].pop("resourceVersion"), "metadata.resourceVersion must be a non-empty"),
        (lambda o: o.update(status="Running"), "status must be an object"),
    ],
)
def test_malformed_pods_name_the_field(mutate, message):
    obj = _stored(pod("a", "10.0.0.1"))
    mutate(obj)
    with pytest.raises(ApiObjectError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_pod(obj)


def test_an_inference_pool_gives_its_selector_and_ports():
    spec = parse_inference_pool(_stored(inference_pool("llama", {"app": "v"}, [8000, 8001])))
    assert spec.match_labels == {"app": "v"} and spec.target_ports == (8000, 8001)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"targetPorts": [{"number": 8000}]}, "spec.selector must be an object"),
        ({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]}, "matchLabels is empty"),
        (
            {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []},
            "spec.targetPorts must be a non-empty",
        ),
        ({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 0}]}, r"\[0\]\.number must be"),
        ({"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": True}]}, "must be a port"),
        (
            {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 80}, {"number": 80}]},
            "lists port 80 twice",
        ),
    ],
)
def test_malformed_inference_pools_name_the_field(spec, message):
    obj = _stored({"metadata": {"name": "llama", "namespace": "ns"}, "spec": spec})
    with pytest.raises(ApiObjectError, match=f"InferencePool ns/llama: .*{message}"):
        parse_inference_pool(obj)
