"""Discovery against the in-test API server: the pool follows the Ready pods × target ports through pod
and InferencePool changes, dropped watches, compaction (410 Gone), an API server that goes away, and
bookmarks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from slorouter.discovery.start import KubernetesConfigError, KubernetesDiscovery, start_discovery
from slorouter.discovery.watcher import PoolWatcher
from slorouter.pool.config import PoolConfig
from slorouter.pool.state import PoolState
from tests.discovery.conftest import discovery_config, eventually
from tests.helpers.kube_apiserver import FakeKubeApiServer, inference_pool, pod


def addresses(pool: PoolState) -> list[str]:
    return sorted(endpoint.address for endpoint in pool.endpoints)


class Running:
    """A started discovery and its pool."""

    def __init__(self, pool: PoolState, handle: KubernetesDiscovery) -> None:
        self.pool = pool
        self.handle = handle

    @property
    def watcher(self) -> PoolWatcher:
        return self.handle.watcher

    async def settle(self, expected: list[str], what: str = "") -> None:
        await eventually(lambda: addresses(self.pool) == sorted(expected), what=what or f"pool == {expected}")


@pytest.fixture
async def discover(kubeconfig: Path) -> AsyncIterator[Any]:
    handles: list[KubernetesDiscovery] = []

    async def start(**fields: Any) -> Running:
        pool = PoolState()
        handle = await start_discovery(PoolConfig(kubernetes=discovery_config(kubeconfig, **fields)), pool)
        assert isinstance(handle, KubernetesDiscovery)
        handles.append(handle)
        return Running(pool, handle)

    yield start
    for handle in handles:
        await handle.stop()


async def test_ready_pods_become_endpoints_and_leave_when_not_ready_or_deleted(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    apiserver.create("pods", pod("b", "10.0.0.2", ready=False))
    apiserver.create("pods", pod("pending", None, ready=False, phase="Pending"))
    apiserver.create("pods", pod("other", "10.0.0.9", labels={"app": "other"}))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000])
    assert addresses(run.pool) == ["10.0.0.1:8000"]  # start_discovery waited for the first list
    assert run.pool.get("10.0.0.1:8000").name == "a"
    assert run.pool.get("10.0.0.1:8000").labels == {"app": "vllm"}

    apiserver.update("pods", pod("b", "10.0.0.2"))
    await run.settle(["10.0.0.1:8000", "10.0.0.2:8000"], "b became Ready")
    apiserver.update("pods", pod("a", "10.0.0.1", ready=False))
    await run.settle(["10.0.0.2:8000"], "a became NotReady")
    apiserver.update("pods", pod("pending", "10.0.0.3"))  # scheduled, started, Ready
    await run.settle(["10.0.0.2:8000", "10.0.0.3:8000"], "pending became Ready")
    apiserver.delete("pods", "default", "b")
    await run.settle(["10.0.0.3:8000"], "b deleted")
    # The watch asked for what the selector names, with bookmarks, resuming from a version.
    watches = [r for r in apiserver.requests if r.watch and r.path.endswith("/pods")]
    assert watches and all(r.query["labelSelector"] == "app=vllm" for r in watches)
    assert all(r.query["allowWatchBookmarks"] == "True" and r.query["resourceVersion"] for r in watches)


async def test_a_terminating_pod_leaves_before_it_is_gone(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000])
    terminating = apiserver.get("pods", "default", "a")
    terminating["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:30Z"
    apiserver.update("pods", terminating)  # still Ready: kubelet has not noticed yet
    await run.settle([], "a terminating")


async def test_an_ip_change_moves_the_endpoint(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000])
    apiserver.update("pods", pod("a", "10.0.0.7"))
    await run.settle(["10.0.0.7:8000"])
    assert run.pool.get("10.0.0.7:8000").name == "a"


async def test_a_pod_whose_labels_stop_matching_leaves(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    apiserver.create("pods", pod("b", "10.0.0.2"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000])
    apiserver.update("pods", pod("a", "10.0.0.1", labels={"app": "vllm-old"}))  # a DELETED for this watch
    await run.settle(["10.0.0.2:8000"])
    apiserver.update("pods", pod("a", "10.0.0.1", labels={"app": "vllm", "role": "decode"}))  # ADDED
    await run.settle(["10.0.0.1:8000", "10.0.0.2:8000"])
    assert run.pool.get("10.0.0.1:8000").labels == {"app": "vllm", "role": "decode"}


async def test_every_target_port_of_an_inference_pool_is_an_endpoint(apiserver, discover):
    apiserver.create("inferencepools", inference_pool("llama", ports=[8000, 8001, 8002]))
    apiserver.create("pods", pod("a", "10.0.0.1"))
    apiserver.create("pods", pod("b", "fd00::2"))
    run = await discover(inference_pool="llama")
    want = [f"{host}:{port}" for host in ("10.0.0.1", "[fd00::2]") for port in (8000, 8001, 8002)]
    assert addresses(run.pool) == sorted(want)
    # Pool-wide port changes are followed; target_ports of the config would override them.
    apiserver.update("inferencepools", inference_pool("llama", ports=[9000]))
    await run.settle(["10.0.0.1:9000", "[fd00::2]:9000"])


async def test_target_ports_in_the_config_override_the_inference_pool(apiserver, discover):
    apiserver.create("inferencepools", inference_pool("llama", ports=[8000]))
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(inference_pool="llama", target_ports=[7000, 7001])
    assert addresses(run.pool) == ["10.0.0.1:7000", "10.0.0.1:7001"]


async def test_a_selector_change_on_the_inference_pool_is_followed(apiserver, discover):
    apiserver.create("inferencepools", inference_pool("llama", {"app": "vllm"}))
    apiserver.create("pods", pod("a", "10.0.0.1", labels={"app": "vllm"}))
    apiserver.create("pods", pod("b", "10.0.0.2", labels={"app": "vllm", "version": "v2"}))
    apiserver.create("pods", pod("c", "10.0.0.3", labels={"app": "sglang", "version": "v2"}))
    run = await discover(inference_pool="llama")
    assert addresses(run.pool) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    apiserver.update("inferencepools", inference_pool("llama", {"version": "v2"}))
    await run.settle(["10.0.0.2:8000", "10.0.0.3:8000"], "the new selector's pods")
    # Only the new selector's watch is open; changes to its pods are followed.
    await eventually(lambda: apiserver.open_watches("pods") == 1, what="one pod watch")
    apiserver.update("pods", pod("c", "10.0.0.3", labels={"app": "sglang", "version": "v2"}, ready=False))
    await run.settle(["10.0.0.2:8000"])
    assert run.watcher.pods is not None
    assert "version=v2" in run.watcher.pods.source.description


async def test_a_missing_or_deleted_inference_pool_empties_the_pool_until_it_exists(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(inference_pool="llama", initial_sync_timeout_s=2)
    assert addresses(run.pool) == []  # synced at once: the pool does not exist (no 2 s wait)
    apiserver.create("inferencepools", inference_pool("llama"))
    await run.settle(["10.0.0.1:8000"], "pool created")
    apiserver.delete("inferencepools", "default", "llama")
    await run.settle([], "pool deleted")
    apiserver.create("inferencepools", inference_pool("llama", ports=[8100]))
    await run.settle(["10.0.0.1:8100"], "pool back")


async def test_changes_while_the_watch_was_cut_are_caught_up(apiserver, discover):
    for i in range(3):
        apiserver.create("pods", pod(f"p{i}", f"10.0.0.{i + 1}"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000])
    await eventually(lambda: apiserver.open_watches("pods") == 1, what="watch open")
    apiserver.drop_watches()
    apiserver.delete("pods", "default", "p0")
    apiserver.create("pods", pod("p3", "10.0.0.4"))
    apiserver.update("pods", pod("p1", "10.0.0.2", ready=False))
    await run.settle(["10.0.0.3:8000", "10.0.0.4:8000"])
    pods = run.watcher.pods
    assert pods is not None
    assert pods.stats.lists == 1 and pods.stats.expired == 0  # resumed from its version, no relist
    assert pods.stats.errors >= 1  # the cut was seen as one


@pytest.mark.parametrize("how", ["resume-after-compaction", "error-event-on-open-watch", "http-410"])
async def test_410_gone_after_compaction_relists_without_losing_or_doubling(how, tmp_path: Path):
    server = FakeKubeApiServer(watch_expiry_as_http=how == "http-410")
    await server.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(server.kubeconfig())
    pool = PoolState()
    for i in range(4):
        server.create("pods", pod(f"p{i}", f"10.0.0.{i + 1}"))
    handle = await start_discovery(
        PoolConfig(
            kubernetes=discovery_config(kubeconfig, label_selector={"app": "vllm"}, target_ports=[8000, 8001])
        ),
        pool,
    )
    assert isinstance(handle, KubernetesDiscovery)
    try:
        await eventually(lambda: server.open_watches("pods") == 1, what="watch open")
        if how == "error-event-on-open-watch":
            server.compact(expire_watches=True)  # the open watch gets ERROR 410 and ends
            server.delete("pods", "default", "p0")
        else:
            server.drop_watches()  # away while these changes happen and are compacted
            server.delete("pods", "default", "p0")
            server.update("pods", pod("p1", "10.0.0.21"))
            server.create("pods", pod("p9", "10.0.0.9"))
            server.compact()
        want = {pod_ip for name, pod_ip in _serving(server)}
        await eventually(
            lambda: addresses(pool) == sorted(f"{ip}:{port}" for ip in want for port in (8000, 8001)),
            what="pool == serving pods × ports",
        )
        reflector = handle.watcher.pods
        assert reflector is not None
        assert reflector.stats.expired >= 1 and reflector.stats.lists >= 2
        assert len(pool.endpoints) == len({e.address for e in pool.endpoints})
        # After the relist, the watch runs again from the list's version.
        server.update("pods", pod("p2", "10.0.0.3", ready=False))
        want.discard("10.0.0.3")
        await eventually(
            lambda: addresses(pool) == sorted(f"{ip}:{port}" for ip in want for port in (8000, 8001)),
            what="following after the relist",
        )
    finally:
        await handle.stop()
        await server.stop()


def _serving(server: FakeKubeApiServer) -> list[tuple[str, str]]:
    return [
        (obj["metadata"]["name"], obj["status"]["podIP"])
        for (resource, _, _), obj in server.objects.items()
        if resource == "pods"
        and obj["metadata"]["labels"].get("app") == "vllm"
        and "deletionTimestamp" not in obj["metadata"]
        and obj["status"].get("phase") == "Running"
        and {"type": "Ready", "status": "True"} in obj["status"]["conditions"]
        and obj["status"].get("podIP")
    ]


async def test_api_server_down_backs_off_and_recovers(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    apiserver.create("pods", pod("b", "10.0.0.2"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000])
    await apiserver.stop()
    # While it is away, the pool keeps what it knew, and the retries space out.
    await asyncio.sleep(1.0)
    assert addresses(run.pool) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    pods = run.watcher.pods
    assert pods is not None
    errors_while_down = pods.stats.errors
    # 20 ms doubling to 200 ms: about 8 attempts in a second; without a pause it would be hundreds.
    assert 2 <= errors_while_down <= 12
    apiserver.delete("pods", "default", "a")  # what happened meanwhile (recorded, compacted away)
    apiserver.create("pods", pod("c", "10.0.0.3"))
    apiserver.compact()
    await apiserver.start()
    await run.settle(["10.0.0.2:8000", "10.0.0.3:8000"], "recovered")
    assert pods.stats.expired >= 1
    apiserver.delete("pods", "default", "b")
    await run.settle(["10.0.0.3:8000"], "watching again")


async def test_a_bookmark_lets_a_watch_resume_past_compacted_changes(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000])
    await eventually(lambda: apiserver.open_watches("pods") == 1, what="watch open")
    pods = run.watcher.pods
    assert pods is not None
    for i in range(5):  # other pods change: this watch sees nothing, its version falls behind
        apiserver.create("pods", pod(f"other-{i}", f"10.0.1.{i}", labels={"app": "other"}))
    assert apiserver.send_bookmarks() == 1
    await eventually(lambda: pods.resource_version == str(apiserver.version), what="bookmark applied")
    assert pods.stats.bookmarks == 1 and pods.stats.events == 0
    apiserver.compact()
    apiserver.drop_watches()
    apiserver.create("pods", pod("b", "10.0.0.2"))
    await run.settle(["10.0.0.1:8000", "10.0.0.2:8000"])
    assert pods.stats.expired == 0 and pods.stats.lists == 1  # resumed from the bookmark: no 410


async def test_a_malformed_pod_is_reported_and_left_out(apiserver, discover, caplog):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    apiserver.create("pods", pod("broken", "10.0.0.300"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000])
    assert addresses(run.pool) == ["10.0.0.1:8000"]
    assert "Pod default/broken: status.podIP '10.0.0.300' is not an IP address" in caplog.text
    assert run.watcher.pods is not None and run.watcher.pods.stats.malformed == 1
    apiserver.update("pods", pod("broken", "10.0.0.30"))  # fixed: it joins
    await run.settle(["10.0.0.1:8000", "10.0.0.30:8000"])


async def test_a_rejected_token_is_retried_without_crashing(apiserver, kubeconfig, caplog):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    apiserver.token = "rotated"
    pool = PoolState()
    config = discovery_config(
        kubeconfig, label_selector={"app": "vllm"}, target_ports=[8000], initial_sync_timeout_s=0.3
    )
    handle = await start_discovery(PoolConfig(kubernetes=config), pool)
    try:
        assert addresses(pool) == []
        assert "list failed (401: Unauthorized)" in caplog.text
        assert "no answer from the Kubernetes API server" in caplog.text
        apiserver.token = "test-token"  # the kubeconfig's token is accepted again
        await eventually(lambda: addresses(pool) == ["10.0.0.1:8000"], what="listed after the 401s")
    finally:
        await handle.stop()


async def test_missing_credentials_are_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = discovery_config(tmp_path / "nowhere", inference_pool="llama")
    with pytest.raises(KubernetesConfigError, match=r"kubeconfig .*nowhere does not exist"):
        await start_discovery(PoolConfig(kubernetes=config), PoolState())
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(KubernetesConfigError, match=r"cannot load Kubernetes credentials from .*broken"):
        await start_discovery(
            PoolConfig(kubernetes=config.model_copy(update={"kubeconfig": str(broken)})), PoolState()
        )


async def test_static_endpoints_need_no_discovery():
    pool = PoolState()
    handle = await start_discovery(PoolConfig(endpoints=["10.0.0.1:8000"]), pool)
    await handle.stop()
    assert addresses(pool) == []  # the runtime fills a static pool from the config itself


async def test_a_watch_the_server_ends_on_time_is_resumed_without_a_relist(apiserver, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000], watch_timeout_s=1)
    watches = lambda: [r for r in apiserver.requests if r.watch]  # noqa: E731
    await eventually(lambda: len(watches()) >= 2, timeout_s=5, what="a second watch after timeoutSeconds=1")
    assert all(r.query["timeoutSeconds"] == "1" for r in watches())
    apiserver.create("pods", pod("b", "10.0.0.2"))
    await run.settle(["10.0.0.1:8000", "10.0.0.2:8000"])
    pods = run.watcher.pods
    assert pods is not None and pods.stats.lists == 1 and pods.stats.errors == 0
