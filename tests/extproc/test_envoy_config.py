"""The Envoy bootstrap the picker generates: what it asks of Envoy, and the setups it refuses."""

from __future__ import annotations

import pytest

from slorouter.extproc.envoy import EnvoySetup, bootstrap


def _filter(config: dict) -> dict:
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return manager["http_filters"][0]["typed_config"]


def _cluster(config: dict, name: str) -> dict:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


def test_full_duplex_asks_for_the_request_trailers_and_a_streamed_response():
    config = bootstrap(EnvoySetup("127.0.0.1", 8080, "127.0.0.1", 9002, endpoints=("10.0.0.1:8000",)))
    mode = _filter(config)["processing_mode"]
    assert (mode["request_body_mode"], mode["response_body_mode"]) == ("FULL_DUPLEX_STREAMED", "STREAMED")
    assert mode["request_trailer_mode"] == "SEND"
    assert _filter(config)["metadata_options"]["receiving_namespaces"] == {"untyped": ["envoy.lb"]}
    policy = _cluster(config, "pool")["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    assert _cluster(config, "pool")["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"] == {
        "address": {"socket_address": {"address": "10.0.0.1", "port_value": 8000}}
    }


def test_buffered_original_dst_reads_the_destination_header():
    setup = EnvoySetup(
        "127.0.0.1", 8080, "127.0.0.1", 9002, request_body_mode="buffered", cluster="original_dst"
    )
    config = bootstrap(setup)
    assert _filter(config)["processing_mode"]["request_body_mode"] == "BUFFERED"
    assert _cluster(config, "pool")["original_dst_lb_config"] == {
        "use_http_header": True,
        "http_header_name": "x-gateway-destination-endpoint",
    }


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (EnvoySetup("h", 1, "h", 2, endpoints=("a:1",), failure_mode_allow=True), "buffered"),
        (EnvoySetup("h", 1, "h", 2), "endpoints"),
    ],
)
def test_setups_envoy_cannot_run_are_refused(setup: EnvoySetup, needle: str):
    with pytest.raises(ValueError, match=needle):
        bootstrap(setup)
