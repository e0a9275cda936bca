"""``pool.kubernetes``: discovery's settings, checked with errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from slorouter.config import ConfigError, parse_config


def _error(pool: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config({"pool": pool}, "gw.yaml")
    return str(info.value)


def test_an_inference_pool_or_a_label_selector():
    config = parse_config({"pool": {"kubernetes": {"namespace": "llm", "inference_pool": "llama.v1"}}})
    assert config.pool is not None and config.pool.kubernetes is not None
    assert config.pool.endpoints == [] and config.pool.kubernetes.target_ports is None
    config = parse_config(
        {
            "pool": {
                "kubernetes": {
                    "namespace": "llm",
                    "label_selector": {"app.kubernetes.io/name": "vllm", "tier": "a"},
                    "target_ports": [8000, 8001],
                    "kubeconfig": "~/.kube/config",
                }
            }
        }
    )
    assert config.pool is not None and config.pool.kubernetes is not None
    assert config.pool.kubernetes.target_ports == [8000, 8001]


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        (
            {},
            "gw.yaml: pool.endpoints: the pool needs model servers: a list of 'host:port', or pool.kube",
        ),
        (
            {"endpoints": ["a:1"], "kubernetes": {"namespace": "n", "inference_pool": "p"}},
            "pool.endpoints: set either pool.endpoints (static model servers) or pool.kubernetes, not both",
        ),
        ({"kubernetes": {"inference_pool": "p"}}, "pool.kubernetes.namespace: field required"),
        ({"kubernetes": {"namespace": "n"}}, "pool.kubernetes: set exactly one of inference_pool"),
        (
            {"kubernetes": {"namespace": "n", "inference_pool": "p", "label_selector": {"a": "b"}}},
            "set exactly one of inference_pool",
        ),
        (
            {"kubernetes": {"namespace": "n", "label_selector": {"a": "b"}}},
            "label_selector needs target_ports",
        ),
        (
            {"kubernetes": {"namespace": "Prod", "inference_pool": "p"}},
            "namespace: 'Prod' is not a namespace",
        ),
        (
            {"kubernetes": {"namespace": "n", "inference_pool": "P_1"}},
            "inference_pool: 'P_1' is not an object",
        ),
        ({"kubernetes": {"namespace": "n", "label_selector": {}, "target_ports": [1]}}, "an empty selector"),
        (
            {"kubernetes": {"namespace": "n", "label_selector": {"app": "-x"}, "target_ports": [1]}},
            "label value '-x'",
        ),
        (
            {"kubernetes": {"namespace": "n", "label_selector": {"a b": "x"}, "target_ports": [1]}},
            "label key 'a b'",
        ),
        (
            {"kubernetes": {"namespace": "n", "inference_pool": "p", "target_ports": [80, 80]}},
            "duplicate port",
        ),
        ({"kubernetes": {"namespace": "n", "inference_pool": "p", "target_ports": [70000]}}, "port 70000"),
        ({"kubernetes": {"namespace": "n", "inference_pool": "p", "target_ports": []}}, "at least 1 item"),
        ({"kubernetes": {"namespace": "n", "inference_pool": "p", "watch": True}}, "kubernetes.watch: extra"),
        (
            {
                "kubernetes": {
                    "namespace": "n",
                    "inference_pool": "p",
                    "backoff_initial_ms": 10,
                    "backoff_max_ms": 5,
                }
            },
            "backoff_max_ms must be >= backoff_initial_ms",
        ),
    ],
)
def test_errors_name_the_key(pool, message):
    assert message.lower() in _error(pool).lower()


def _kv(kv_events: object) -> dict[str, Any]:
    return {"kubernetes": {"namespace": "n", "inference_pool": "p", "kv_events": kv_events}}


def test_kv_events_of_discovered_pods():
    config = parse_config({"pool": _kv({})})
    assert config.pool is not None and config.pool.kubernetes is not None
    kv_events = config.pool.kubernetes.kv_events
    assert kv_events is not None and (kv_events.port, kv_events.replay_port, kv_events.topic) == (
        5557,
        None,
        "",
    )
    config = parse_config({"pool": _kv({"port": 6000, "replay_port": 6001, "topic": "kv@"})})
    assert config.pool is not None and config.pool.kubernetes is not None
    assert (
        config.pool.kubernetes.kv_events is not None and config.pool.kubernetes.kv_events.replay_port == 6001
    )
    config = parse_config({"pool": {"kubernetes": {"namespace": "n", "inference_pool": "p"}}})
    assert config.pool is not None and config.pool.kubernetes is not None
    assert config.pool.kubernetes.kv_events is None


@pytest.mark.parametrize(
    ("kv_events", "message"),
    [
        ({"port": 0}, "pool.kubernetes.kv_events.port: input should be greater than or equal to 1"),
        ({"replay_port": 70000}, "pool.kubernetes.kv_events.replay_port: input should be less than or equal"),
        ({"port": 5557, "replay_port": 5557}, "pool.kubernetes.kv_events: replay_port must differ from port"),
        ({"endpoint": "tcp://x:1"}, "pool.kubernetes.kv_events.endpoint: extra"),
    ],
)
def test_kv_events_errors_name_the_key(kv_events, message):
    assert message.lower() in _error(_kv(kv_events)).lower()
