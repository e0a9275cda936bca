"""``slorouter serve`` restarted on a state directory that holds a previous run's models: it routes by
prediction at once, and refuses (and counts) models of another pool; routers of two configurations keep
their state apart."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from slorouter.config import load_config, parse_config
from slorouter.gateway.runtime import Router
from slorouter.predictor.embedded import EmbeddedPredictor
from slorouter.predictor.pool_shape import PoolShape
from slorouter.predictor.sample_window import read_window
from slorouter.predictor.state_dir import SAMPLE_WINDOW, StateDirBusyError, StateDirLock, default_state_dir
from slorouter.predictor.trainer import TrainerConfig
from slorouter.sim.profiles import LLAMA3_8B_H100
from slorouter.sim.server import SimCluster
from tests.helpers.predictor_models import synthetic
from tests.helpers.processes import stop_cleanly
from tests.helpers.serve import complete, start_serve

# The embedded default's pool: 4 simulated llama3-8b-h100 pods.
EMBEDDED_POOL = PoolShape(((LLAMA3_8B_H100.block_size, LLAMA3_8B_H100.num_gpu_blocks),))
OTHER_POOL = PoolShape(((16, 1234),))


async def previous_run(state_dir: Path, shape: PoolShape) -> dict[str, str | None]:
    """What a router leaves behind: both models trained on ``shape``'s pool, and its sample window."""
    config = TrainerConfig(n_estimators=20, max_depth=4, retrain_interval_s=0.0, nthread=1)
    embedded = EmbeddedPredictor(state_dir, trainer_config=config, background=False, pool_shape=lambda: shape)
    embedded.start()
    x_ttft, y_ttft, x_tpot, y_tpot = synthetic(400, seed=1)
    embedded.store.add("ttft", x_ttft, y_ttft)
    embedded.store.add("tpot", x_tpot, y_tpot)
    assert len(embedded.maybe_train()) == 2
    await embedded.stop()
    return embedded.versions


def metrics(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return str(response.read().decode())


@pytest.mark.processes
async def test_a_restarted_router_routes_by_prediction_within_a_second(state_home: Path) -> None:
    state_dir = default_state_dir("serve", "embedded")  # the default's, under this test's XDG_STATE_HOME
    assert state_dir.is_relative_to(state_home)
    versions = await previous_run(state_dir, EMBEDDED_POOL)
    process, address, listening = start_serve()
    try:
        route, answered = complete(address)
        assert route == "predicted", stop_cleanly(process)
        print(f"first request answered {answered - listening:.3f} s after the gateway listened")
        assert answered - listening < 1.0
        text = metrics(address)
        assert "slorouter_predictor_ready 1.0" in text
        assert f'slorouter_predictor_model_info{{model="ttft",version="{versions["ttft"]}"}} 1.0' in text
        assert "slorouter_predictor_warm_start_refused_total{" not in text
    finally:
        stop_cleanly(process)
    window = read_window(state_dir / SAMPLE_WINDOW)  # saved again at shutdown, with the new sample
    assert window is not None and len(window.kinds["ttft"].seq) == 401


@pytest.mark.processes
async def test_a_router_refuses_models_of_another_pool(state_home: Path) -> None:
    await previous_run(default_state_dir("serve", "embedded"), OTHER_POOL)
    process, address, _ = start_serve()
    try:
        route, _ = complete(address)
        assert route == "fallback"  # warming up as from scratch
        text = metrics(address)
        assert 'slorouter_predictor_warm_start_refused_total{item="model",reason="pool_shape"} 2.0' in text
        assert 'slorouter_predictor_warm_start_refused_total{item="samples",reason="pool_shape"} 1.0' in text
    finally:
        stderr = stop_cleanly(process)
    assert stderr.count("refused the saved ttft model (pool_shape)") == 1, stderr
    assert "requests are routed by heuristics until a TTFT model is trained" in stderr
    assert "learnt on a pool of 1234 blocks of 16 tokens, but this pool also has 29205 blocks" in stderr
    assert " ERROR " not in stderr, stderr


async def test_routers_of_two_config_files_keep_apart_state(
    tmp_path: Path, state_home: Path, cluster: SimCluster
) -> None:
    """Two configurations (two pools, or two policies on one) each get a state directory of their own: both
    start, and neither sees the other's models."""
    paths = []
    for name in ("pool-a", "pool-b"):
        path = tmp_path / f"{name}.yaml"
        config = {"gateway": {"port": 0}, "pool": {"endpoints": list(cluster.addresses)}, "predictor": {}}
        path.write_text(json.dumps(config))  # JSON is YAML
        paths.append(path)
    routers = [Router.build(load_config(path), config_path=path) for path in paths]
    try:
        for router in routers:
            await router.start()  # a shared directory would be in use by the first: a configuration error
        state_dirs = [router.core.predictor.state_dir for router in routers]  # type: ignore[union-attr]
        assert state_dirs[0] != state_dirs[1]
        assert [d.parent for d in state_dirs] == [state_home / "slorouter" / "serve"] * 2
        assert [d.name[:7] for d in state_dirs] == ["pool-a-", "pool-b-"]
    finally:
        for router in routers:
            await router.stop()


async def test_a_state_directory_in_use_is_refused_saying_what_to_do(
    tmp_path: Path, cluster: SimCluster
) -> None:
    lock = StateDirLock(tmp_path / "state")
    config = parse_config(
        {
            "gateway": {"port": 0},
            "pool": {"endpoints": list(cluster.addresses)},
            "predictor": {"embedded": {"state_dir": str(tmp_path / "state")}},
        }
    )
    router = Router.build(config)
    try:
        busy = r"state directory .* is in use .*: stop that process, .* \(--state-dir DIR, or predictor"
        with pytest.raises(StateDirBusyError, match=busy):
            await router.start()
    finally:
        await router.stop()
        lock.release()


def test_the_state_age_limit_reaches_the_embedded_predictor(state_home: Path) -> None:
    for embedded, limit in (
        ({}, 24 * 3600.0),
        ({"max_state_age_s": 60}, 60.0),
        ({"max_state_age_s": None}, None),
    ):
        config = parse_config({"pool": {"endpoints": ["127.0.0.1:9"]}, "predictor": {"embedded": embedded}})
        predictor = Router.build(config).core.predictor
        assert isinstance(predictor, EmbeddedPredictor) and predictor.persistence is not None
        assert predictor.persistence.max_age_s == limit
