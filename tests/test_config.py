"""The serve configuration: defaults, and errors that name the key."""

from __future__ import annotations

import pytest

from slorouter.config import ConfigError, load_config, parse_config


def test_defaults():
    config = parse_config({})
    assert config.gateway.host == "127.0.0.1"
    assert config.gateway.port == 8080
    assert config.pool is None
    assert config.scheduler is None


def test_full_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "gateway: {host: 0.0.0.0, port: 9000}\n"
        "pool: {endpoints: ['127.0.0.1:8100', '127.0.0.1:8101']}\n"
        "scheduler:\n  plugins: [{type: queue-scorer}]\n"
    )
    config = load_config(path)
    assert config.gateway.port == 9000
    assert config.pool is not None and len(config.pool.endpoints) == 2
    assert config.scheduler == {"plugins": [{"type": "queue-scorer"}]}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"gatway": {}}, "gatway"),
        ({"gateway": {"port": 70000}}, "gateway.port"),
        ({"gateway": {"port": "http"}}, "gateway.port"),
        ({"gateway": {"bogus": 1}}, "gateway.bogus"),
        ({"gateway": {"request_head_timeout_s": 0}}, "gateway.request_head_timeout_s"),
        ({"gateway": {"request_body_timeout_s": -1}}, "gateway.request_body_timeout_s"),
        ({"gateway": {"keepalive_timeout_s": "long"}}, "gateway.keepalive_timeout_s"),
        ({"gateway": {"send_timeout_s": 0}}, "gateway.send_timeout_s"),
        ({"gateway": {"max_connections": 0}}, "gateway.max_connections"),
        ({"gateway": {"max_buffered_bytes": 10}}, "gateway.max_buffered_bytes"),
        ({"gateway": {"max_header_bytes": 100}}, "gateway.max_header_bytes"),
        ({"gateway": {"max_header_fields": 0}}, "gateway.max_header_fields"),
        ({"gateway": {"max_request_target_bytes": 10}}, "gateway.max_request_target_bytes"),
        ({"gateway": {"max_pipelined_requests": 0}}, "gateway.max_pipelined_requests"),
        ({"gateway": {"max_concurrent_requests": 0}}, "gateway.max_concurrent_requests"),
        ({"pool": {"endpoints": ["nohostport"]}}, "pool.endpoints"),
        ({"seed": "x"}, "seed"),
        ({"predictor": {"embedded": {"model_dir": "/x"}}}, "predictor.embedded.model_dir"),
        ({"predictor": {"embedded": {"state_dir": ""}}}, "predictor.embedded.state_dir"),
        ({"predictor": {"embedded": {"save_interval_s": 0}}}, "predictor.embedded.save_interval_s"),
        ({"predictor": {"embedded": {"max_state_age_s": 0}}}, "predictor.embedded.max_state_age_s"),
        ({"predictor": {"embedded": {"persist": "maybe"}}}, "predictor.embedded.persist"),
        ({"predictor": {"embedded": {"persist": False, "state_dir": "/x"}}}, "predictor.embedded"),
    ],
)
def test_errors_name_the_key(data, needle):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert needle in str(info.value)


def test_predictor_state_defaults():
    embedded = parse_config({"predictor": {}}).predictor.embedded  # type: ignore[union-attr]
    assert (embedded.persist, embedded.state_dir, embedded.save_interval_s) == (True, None, 60.0)
    assert embedded.max_state_age_s == 24 * 3600  # a day; null: no limit
    unlimited = parse_config({"predictor": {"embedded": {"max_state_age_s": None}}}).predictor.embedded  # type: ignore[union-attr]
    assert unlimited.max_state_age_s is None


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        parse_config([1, 2])


def test_bad_yaml_and_missing_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("gateway: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: invalid YAML \(line 2, column 1\)"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("data", "enabled"),
    [
        ({}, False),  # the heuristic profile
        ({"predictor": {"mode": "embedded"}}, True),  # the built-in predicted-latency pipeline
        ({"predictor": {"mode": "off"}}, False),
        ({"predictor": {"mode": "embedded"}, "flowControl": {"enabled": False}}, False),
        ({"predictor": {"mode": "embedded"}, "scheduler": {"plugins": []}}, False),  # the user's own
        ({"flowControl": {"enabled": True}}, True),
    ],
)
def test_flow_control_is_on_by_default_only_with_the_predicted_latency_pipeline(data, enabled):
    assert parse_config(data).flow_control_enabled is enabled
