"""Discovery's Prometheus series move with what happens: pods joining and leaving, watches cut, expired and
ended on time, the InferencePool's changes, malformed objects and failed lists; and both front-ends' router
exposes them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from slorouter.config import parse_config
from slorouter.discovery.start import KubernetesDiscovery, start_discovery
from slorouter.metrics import DiscoveryMetrics
from slorouter.pool.config import PoolConfig
from slorouter.pool.state import PoolState
from slorouter.serving.assembly import RouterCore
from tests.discovery.conftest import discovery_config, eventually
from tests.helpers.kube_apiserver import FakeKubeApiServer, inference_pool, pod


class Running:
    def __init__(self, pool: PoolState, handle: KubernetesDiscovery, registry: CollectorRegistry) -> None:
        self.pool = pool
        self.handle = handle
        self.registry = registry

    def value(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def pods(self) -> dict[str, float]:
        return {
            state: self.value("slorouter_discovery_pods", state=state)
            for state in ("serving", "not_ready", "pending", "terminating")
        }

    async def reaches(self, name: str, want: float, **labels: str) -> None:
        await eventually(lambda: self.value(name, **labels) == want, what=f"{name}{labels} == {want}")


@pytest.fixture
async def discover(kubeconfig: Path) -> AsyncIterator[Any]:
    handles: list[KubernetesDiscovery] = []

    async def start(**fields: Any) -> Running:
        pool, registry = PoolState(), CollectorRegistry()
        config = PoolConfig(kubernetes=discovery_config(kubeconfig, **fields))
        handle = await start_discovery(config, pool, observer=DiscoveryMetrics(registry))
        assert isinstance(handle, KubernetesDiscovery)
        handles.append(handle)
        return Running(pool, handle, registry)

    yield start
    for handle in handles:
        await handle.stop()


async def test_membership_pod_states_and_events_are_counted(apiserver: FakeKubeApiServer, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    apiserver.create("pods", pod("b", "10.0.0.2", ready=False))
    apiserver.create("pods", pod("c", None, ready=False, phase="Pending"))
    before = time.time()
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000, 8001])
    assert run.value("slorouter_discovery_endpoints") == 2
    assert run.pods() == {"serving": 1, "not_ready": 1, "pending": 1, "terminating": 0}
    assert run.value("slorouter_discovery_endpoint_changes_total", change="added") == 2
    assert run.value("slorouter_discovery_lists_total", resource="pods", result="ok") == 1
    assert run.value("slorouter_discovery_last_sync_timestamp_seconds", resource="pods") >= before

    apiserver.update("pods", pod("b", "10.0.0.2"))
    await run.reaches("slorouter_discovery_endpoints", 4)
    terminating = apiserver.get("pods", "default", "a")
    terminating["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:30Z"
    apiserver.update("pods", terminating)
    await run.reaches("slorouter_discovery_endpoints", 2)
    assert run.pods() == {"serving": 1, "not_ready": 0, "pending": 1, "terminating": 1}
    apiserver.delete("pods", "default", "a")
    apiserver.delete("pods", "default", "c")
    await run.reaches("slorouter_discovery_pods", 0, state="pending")
    assert run.value("slorouter_discovery_endpoint_changes_total", change="added") == 4
    assert run.value("slorouter_discovery_endpoint_changes_total", change="removed") == 2
    assert run.value("slorouter_discovery_watch_events_total", resource="pods", type="MODIFIED") == 2
    assert run.value("slorouter_discovery_watch_events_total", resource="pods", type="DELETED") == 2
    assert run.pods() == {"serving": 1, "not_ready": 0, "pending": 0, "terminating": 0}


async def test_watch_restarts_are_counted_by_reason(apiserver: FakeKubeApiServer, discover):
    apiserver.create("pods", pod("a", "10.0.0.1"))
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000], watch_timeout_s=1)
    restarts = "slorouter_discovery_watch_restarts_total"
    # The server ends the watch after timeoutSeconds: resumed, counted as ended, and in sync.
    synced = run.value("slorouter_discovery_last_sync_timestamp_seconds", resource="pods")
    await run.reaches(restarts, 1, resource="pods", reason="ended")
    assert run.value("slorouter_discovery_last_sync_timestamp_seconds", resource="pods") > synced
    # Cut mid-stream: an error, resumed.
    await eventually(lambda: apiserver.open_watches("pods") == 1)
    apiserver.drop_watches()
    await run.reaches(restarts, 1, resource="pods", reason="error")
    # 410 Gone on the open watch: relisted.
    await eventually(lambda: apiserver.open_watches("pods") == 1)
    apiserver.compact(expire_watches=True)
    await run.reaches(restarts, 1, resource="pods", reason="expired")
    await run.reaches("slorouter_discovery_lists_total", 2, resource="pods", result="ok")
    # A bookmark is a watch event too, and brings the sync time forward.
    await eventually(lambda: apiserver.open_watches("pods") == 1)
    apiserver.send_bookmarks()
    await run.reaches("slorouter_discovery_watch_events_total", 1, resource="pods", type="BOOKMARK")
    assert run.value("slorouter_discovery_endpoints") == 1


async def test_failed_lists_and_malformed_objects_are_counted(apiserver: FakeKubeApiServer, discover):
    broken = pod("broken", "10.0.0.9")
    broken["status"]["conditions"] = "Ready"
    apiserver.create("pods", broken)
    apiserver.create("pods", pod("a", "10.0.0.1"))
    await apiserver.stop()
    run = await discover(label_selector={"app": "vllm"}, target_ports=[8000], initial_sync_timeout_s=0.2)
    assert run.value("slorouter_discovery_lists_total", resource="pods", result="error") >= 1
    assert run.value("slorouter_discovery_last_sync_timestamp_seconds", resource="pods") == 0
    await apiserver.start()
    await run.reaches("slorouter_discovery_lists_total", 1, resource="pods", result="ok")
    assert run.value("slorouter_discovery_malformed_objects_total", resource="pods") == 1
    assert run.value("slorouter_discovery_endpoints") == 1
    assert run.value("slorouter_discovery_last_sync_timestamp_seconds", resource="pods") > 0


async def test_inference_pool_changes_are_counted(apiserver: FakeKubeApiServer, discover):
    run = await discover(inference_pool="llama")
    changes = "slorouter_discovery_inference_pool_changes_total"
    assert run.value(changes, change="appeared") == 0
    apiserver.create("pods", pod("a", "10.0.0.1"))
    apiserver.create("inferencepools", inference_pool("llama"))
    await run.reaches(changes, 1, change="appeared")
    await run.reaches("slorouter_discovery_endpoints", 1)
    apiserver.update("inferencepools", inference_pool("llama", ports=[8000, 8001]))
    await run.reaches(changes, 1, change="target_ports")
    await run.reaches("slorouter_discovery_endpoints", 2)
    apiserver.update("inferencepools", inference_pool("llama", {"app": "vllm", "tier": "a"}, [8000, 8001]))
    await run.reaches(changes, 1, change="selector")
    await run.reaches("slorouter_discovery_endpoints", 0)
    unrelated = inference_pool("llama", {"app": "vllm", "tier": "a"}, [8000, 8001])
    unrelated["metadata"]["labels"] = {"team": "x"}  # neither selector nor ports
    apiserver.update("inferencepools", unrelated)
    await run.reaches("slorouter_discovery_watch_events_total", 3, resource="inferencepools", type="MODIFIED")
    assert run.value(changes, change="target_ports") == 1 and run.value(changes, change="selector") == 1
    apiserver.delete("inferencepools", "default", "llama")
    await run.reaches(changes, 1, change="gone")
    assert run.value("slorouter_discovery_endpoints") == 0


async def test_the_routers_metrics_include_discoverys(apiserver: FakeKubeApiServer, kubeconfig: Path):
    """``slorouter serve`` and ``slorouter epp`` both serve ``RouterCore.metrics``."""
    apiserver.create("inferencepools", inference_pool("llama"))
    apiserver.create("pods", pod("a", "10.0.0.1"))
    kubernetes = {"namespace": "default", "inference_pool": "llama", "kubeconfig": str(kubeconfig)}
    core = RouterCore.build(parse_config({"pool": {"kubernetes": kubernetes}}))
    try:
        await core.start()
        text = core.metrics.render().decode()
        assert "slorouter_discovery_endpoints 1.0" in text
        assert 'slorouter_discovery_pods{state="serving"} 1.0' in text
        assert 'slorouter_discovery_inference_pool_changes_total{change="appeared"} 1.0' in text
        assert "slorouter_discovery_kv_event_subscriptions 0.0" in text
    finally:
        await core.stop()
    static = RouterCore.build(parse_config({"pool": {"endpoints": ["127.0.0.1:9"]}}))
    assert "slorouter_discovery_" not in static.metrics.render().decode()
