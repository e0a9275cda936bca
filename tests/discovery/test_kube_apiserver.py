"""The in-test API server itself answers as the real one does, so that the discovery tests mean something:
raw HTTP requests, no client library."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.helpers.kube_apiserver import FakeKubeApiServer, inference_pool, parse_label_selector, pod

AUTH = {"Authorization": "Bearer test-token", "Accept": "application/json"}
PODS = "/api/v1/namespaces/default/pods"


async def _get(server: FakeKubeApiServer, path: str, **params: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.get(server.url + path, params=params, headers=AUTH) as r:
        return r.status, await r.json()


async def _watch_lines(server: FakeKubeApiServer, count: int, **params: str) -> list[dict]:
    events = []
    params = {"watch": "1", **params}
    async with aiohttp.ClientSession() as http, http.get(server.url + PODS, params=params, headers=AUTH) as r:
        assert r.status == 200
        while len(events) < count:
            line = await r.content.readline()
            if not line:
                break
            events.append(json.loads(line))
    return events


def test_label_selector_syntax():
    labels = {"app": "vllm", "tier": "a"}
    for text, matches in [
        ("app=vllm", True),
        ("app==vllm,tier=a", True),
        ("app!=vllm", False),
        ("tier in (a, b)", True),
        ("tier notin (a,b),app", False),
        ("!gpu", True),
        ("gpu", False),
    ]:
        assert all(r.matches(labels) for r in parse_label_selector(text)) is matches, text


async def test_list_versions_selectors_and_errors(apiserver):
    apiserver.create("pods", pod("a", labels={"app": "vllm"}))
    apiserver.create("pods", pod("b", labels={"app": "other"}))
    status, body = await _get(apiserver, PODS, labelSelector="app=vllm")
    assert status == 200 and body["kind"] == "PodList" and body["metadata"]["resourceVersion"] == "1002"
    assert [item["metadata"]["name"] for item in body["items"]] == ["a"]
    assert body["items"][0]["metadata"]["resourceVersion"] == "1001"
    assert (await _get(apiserver, PODS, labelSelector="app in vllm"))[0] == 400
    assert (await _get(apiserver, PODS, fieldSelector="status.phase=Running"))[0] == 400
    assert (await _get(apiserver, PODS, limit="10"))[0] == 400  # not implemented: refused, not ignored
    assert (await _get(apiserver, PODS, watch="yes"))[0] == 400
    assert (await _get(apiserver, PODS, resourceVersion="99999"))[0] == 504
    apiserver.compact()
    apiserver.create("pods", pod("c"))
    status, body = await _get(apiserver, PODS, resourceVersion="1001", resourceVersionMatch="Exact")
    assert status == 410 and body["reason"] == "Expired" and body["kind"] == "Status"
    status, body = await _get(apiserver, "/apis/inference.networking.k8s.io/v1/namespaces/default/x")
    assert status == 404
    async with aiohttp.ClientSession() as http:
        async with http.get(apiserver.url + PODS, headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        async with http.get(apiserver.url + PODS, headers={**AUTH, "Accept": "application/yaml"}) as r:
            assert r.status == 406
        async with http.post(apiserver.url + PODS, headers=AUTH) as r:
            assert r.status == 405


async def test_watch_replays_from_a_version_and_turns_selector_changes_into_added_and_deleted(apiserver):
    apiserver.create("pods", pod("a", labels={"app": "vllm"}))  # 1001
    apiserver.update("pods", pod("a", labels={"app": "other"}))  # 1002: leaves app=vllm
    apiserver.update("pods", pod("a", labels={"app": "vllm"}))  # 1003: joins again
    apiserver.delete("pods", "default", "a")  # 1004
    events = await _watch_lines(apiserver, 4, resourceVersion="1000", labelSelector="app=vllm")
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in events] == [
        ("ADDED", "1001"),
        ("DELETED", "1002"),
        ("ADDED", "1003"),
        ("DELETED", "1004"),
    ]
    assert events[0]["object"]["kind"] == "Pod"


async def test_watch_without_a_version_starts_with_the_current_objects(apiserver):
    apiserver.create("pods", pod("a"))
    apiserver.create("pods", pod("b"))
    events = await _watch_lines(apiserver, 2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b")]


async def test_watch_from_a_compacted_version_gets_an_error_event_with_410(apiserver):
    apiserver.create("pods", pod("a"))
    apiserver.compact()
    events = await _watch_lines(apiserver, 2, resourceVersion="1000")
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"


@pytest.mark.parametrize("bookmarks", [True, False])
async def test_bookmarks_only_when_asked_and_timeout_ends_the_watch(apiserver, bookmarks):
    async with aiohttp.ClientSession() as http:
        params = {"watch": "true", "resourceVersion": "1000", "timeoutSeconds": "1"}
        if bookmarks:
            params["allowWatchBookmarks"] = "true"
        async with http.get(apiserver.url + PODS, params=params, headers=AUTH) as r:
            while apiserver.open_watches() == 0:
                await asyncio.sleep(0.01)
            apiserver.send_bookmarks()
            apiserver.create("pods", pod("a"))
            lines = [json.loads(line) for line in (await r.read()).splitlines()]  # ends after 1 s
    kinds = [e["type"] for e in lines]
    assert kinds == (["BOOKMARK", "ADDED"] if bookmarks else ["ADDED"])
    if bookmarks:
        assert lines[0]["object"]["metadata"] == {"resourceVersion": "1000"}


async def test_the_inference_pool_resource(apiserver):
    apiserver.create("inferencepools", inference_pool("llama"))
    base = "/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools"
    status, obj = await _get(apiserver, base + "/llama")
    assert (
        status == 200 and obj["kind"] == "InferencePool" and obj["spec"]["targetPorts"] == [{"number": 8000}]
    )
    status, body = await _get(apiserver, base, fieldSelector="metadata.name=other")
    assert status == 200 and body["items"] == []
    assert (await _get(apiserver, base + "/missing"))[0] == 404
