"""Random sequences of pod changes, cut watches, compactions and bookmarks: once the watch has caught up,
the pool's endpoints are exactly the Ready pods × the target ports, each once."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slorouter.discovery.start import start_discovery
from slorouter.pool.config import PoolConfig
from slorouter.pool.state import PoolState
from tests.discovery.conftest import discovery_config, eventually
from tests.helpers.kube_apiserver import FakeKubeApiServer, pod

NAMES = [f"p{i}" for i in range(5)]
PORTS = [8000, 8001]

operation = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("ready"), st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("ip"), st.sampled_from(NAMES), st.integers(1, 3)),
    st.tuples(st.just("label"), st.sampled_from(NAMES), st.sampled_from(["vllm", "other"])),
    st.tuples(st.just("terminate"), st.sampled_from(NAMES)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("drop")),
    st.tuples(st.just("compact")),
    st.tuples(st.just("bookmark")),
    st.tuples(st.just("pause")),
)


def _ip(name: str, n: int) -> str:
    return f"10.0.{NAMES.index(name)}.{n}"  # one subnet per pod name: IPs never collide across pods


def _apply(server: FakeKubeApiServer, op: tuple[object, ...], state: dict[str, dict[str, object]]) -> None:
    kind, *args = op
    if kind in ("drop", "compact", "bookmark", "pause"):
        if kind == "drop":
            server.drop_watches()
        elif kind == "compact":
            server.compact()
        elif kind == "bookmark":
            server.send_bookmarks()
        return
    name = str(args[0])
    current = state.get(name)
    if kind == "create":
        if current is None:
            state[name] = {"ip": _ip(name, int(args[1])), "ready": bool(args[2]), "app": "vllm"}
            server.create("pods", pod(name, str(state[name]["ip"]), ready=bool(args[2])))
        return
    if current is None:
        return
    if kind == "delete":
        del state[name]
        server.delete("pods", "default", name)
        return
    if kind == "ready":
        current["ready"] = bool(args[1])
    elif kind == "ip":
        current["ip"] = _ip(name, int(args[1]))
    elif kind == "label":
        current["app"] = str(args[1])
    obj = pod(name, str(current["ip"]), ready=bool(current["ready"]), labels={"app": str(current["app"])})
    if kind == "terminate" or current.get("terminating"):
        current["terminating"] = True
        obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:30Z"
    server.update("pods", obj)


def _expected(state: dict[str, dict[str, object]]) -> list[str]:
    return sorted(
        f"{entry['ip']}:{port}"
        for entry in state.values()
        if entry["ready"] and entry["app"] == "vllm" and not entry.get("terminating")
        for port in PORTS
    )


async def _scenario(initial: list[tuple[object, ...]], later: list[tuple[object, ...]]) -> None:
    server = FakeKubeApiServer()
    await server.start()
    state: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as directory:
        kubeconfig = Path(directory) / "kubeconfig"
        kubeconfig.write_text(server.kubeconfig())
        for op in initial:
            _apply(server, op, state)
        pool = PoolState()
        config = discovery_config(
            kubeconfig, label_selector={"app": "vllm"}, target_ports=PORTS, backoff_max_ms=50
        )
        handle = await start_discovery(PoolConfig(kubernetes=config), pool)
        try:
            assert sorted(e.address for e in pool.endpoints) == _expected(state)
            for op in later:
                _apply(server, op, state)
                if op[0] == "pause":
                    await asyncio.sleep(0.02)
            await eventually(
                lambda: sorted(e.address for e in pool.endpoints) == _expected(state),
                what=f"pool == Ready pods × ports {_expected(state)}",
            )
            for endpoint in pool.endpoints:
                name = endpoint.name
                assert endpoint.address.rsplit(":", 1)[0] == state[name]["ip"]
        finally:
            await handle.stop()
            await server.stop()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=st.lists(operation, max_size=8), later=st.lists(operation, max_size=25))
def test_the_pool_equals_the_ready_pods_times_ports_after_any_sequence(initial, later):
    asyncio.run(asyncio.wait_for(_scenario(initial, later), 30))
