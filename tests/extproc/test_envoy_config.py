"""The Envoy bootstrap the picker generates: what it asks of Envoy, and the setups it refuses."""

from __future__ import annotations

import pytest

from slorouter.extproc.envoy import EnvoySetup, bootstrap


def _filter(config: dict) -> dict:
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return manager["http_filters"][0]["typed_config"]


def _cluster(config: dict, name: str) -> dict:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


def _filters(config: dict) -> list[dict]:
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return manager["http_filters"]


def _route(config: dict) -> dict:
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return manager["route_config"]["virtual_hosts"][0]["routes"][0]


def test_in_band_full_duplex_asks_for_the_request_trailers_and_a_streamed_response():
    setup = EnvoySetup(
        "127.0.0.1", 8080, "127.0.0.1", 9002, endpoints=("10.0.0.1:8000",), response_path="in-band"
    )
    config = bootstrap(setup)
    mode = _filter(config)["processing_mode"]
    assert (mode["request_body_mode"], mode["response_body_mode"]) == ("FULL_DUPLEX_STREAMED", "STREAMED")
    assert mode["request_trailer_mode"] == "SEND"
    assert _filter(config)["metadata_options"]["receiving_namespaces"] == {"untyped": ["envoy.lb"]}
    assert [f["name"] for f in _filters(config)] == [
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.router",
    ]
    assert "initial_metadata" not in _filter(config)["grpc_service"]  # a plain picking stream
    added = {h["header"]["key"]: h["header"]["value"] for h in _route(config)["response_headers_to_add"]}
    assert added == {
        "x-gateway-destination-endpoint-served": "%UPSTREAM_REMOTE_ADDRESS%",
        "x-slorouter-response-flags": "%RESPONSE_FLAGS%",
        "x-slorouter-upstream-attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    }
    assert "mutation_rules" not in _filter(config)  # no deadline: the picker sets no x-envoy-* header
    assert "hedge_policy" not in _route(config)["route"]


def test_the_observed_response_path_skips_the_response_in_the_picking_filter_and_observes_it_in_another():
    config = bootstrap(EnvoySetup("127.0.0.1", 8080, "127.0.0.1", 9002, endpoints=("10.0.0.1:8000",)))
    picking, observer, router = _filters(config)
    assert router["name"] == "envoy.filters.http.router"
    mode = picking["typed_config"]["processing_mode"]
    assert (mode["response_header_mode"], mode["response_body_mode"]) == ("SKIP", "NONE")
    assert picking["typed_config"]["metadata_options"]["receiving_namespaces"] == {
        "untyped": ["envoy.lb", "slorouter"]
    }
    assert picking["typed_config"]["grpc_service"]["initial_metadata"] == [
        {"key": "x-slorouter-response-path", "value": "observed"}
    ]
    watching = observer["typed_config"]
    assert watching["observability_mode"] is True
    assert watching["failure_mode_allow"] is True  # a picker that is down fails nothing here
    assert watching["grpc_service"]["initial_metadata"] == [
        {"key": "x-slorouter-response-path", "value": "observer"}
    ]
    assert watching["processing_mode"]["request_header_mode"] == "SEND"
    assert (
        watching["processing_mode"]["response_header_mode"],
        watching["processing_mode"]["response_body_mode"],
    ) == ("SEND", "STREAMED")
    assert watching["metadata_options"] == {"forwarding_namespaces": {"untyped": ["slorouter"]}}
    assert watching["response_attributes"] == [
        "upstream.address",
        "response.flags",
        "upstream.request_attempt_count",
    ]
    added = {h["header"]["key"]: h["header"]["value"] for h in _route(config)["response_headers_to_add"]}
    assert added == {
        "x-slorouter-endpoint": "%UPSTREAM_REMOTE_ADDRESS%",
        "x-slorouter-route": "%DYNAMIC_METADATA(slorouter:x-slorouter-route)%",
        "x-slorouter-fallback-reason": "%DYNAMIC_METADATA(slorouter:x-slorouter-fallback-reason)%",
        "x-slorouter-predicted-ttft-ms": "%DYNAMIC_METADATA(slorouter:x-slorouter-predicted-ttft-ms)%",
        "x-slorouter-predicted-tpot-ms": "%DYNAMIC_METADATA(slorouter:x-slorouter-predicted-tpot-ms)%",
        "x-slorouter-queued-ms": "%DYNAMIC_METADATA(slorouter:x-slorouter-queued-ms)%",
        "x-slorouter-scores": "%DYNAMIC_METADATA(slorouter:x-slorouter-scores)%",
        "x-slorouter-runner-up": "%DYNAMIC_METADATA(slorouter:x-slorouter-runner-up)%",
        "x-slorouter-scores-omitted": "%DYNAMIC_METADATA(slorouter:x-slorouter-scores-omitted)%",
    }
    policy = _cluster(config, "pool")["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    assert _cluster(config, "pool")["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"] == {
        "address": {"socket_address": {"address": "10.0.0.1", "port_value": 8000}}
    }


@pytest.mark.parametrize("path", ["observed", "in-band"])
def test_deadlines_let_the_picker_set_envoy_headers_hedge_on_per_try_timeouts_and_answer_in_json(path: str):
    setup = EnvoySetup(
        "127.0.0.1",
        8080,
        "127.0.0.1",
        9002,
        endpoints=("10.0.0.1:8000",),
        response_path=path,  # type: ignore[arg-type]
        hedges=True,
        cancels=True,
    )
    config = bootstrap(setup)
    assert _filter(config)["mutation_rules"] == {"allow_envoy": True}
    assert _route(config)["route"]["hedge_policy"] == {"hedge_on_per_try_timeout": True}
    mode = _filter(config)["processing_mode"]
    if path == "in-band":  # the picker holds a stream's headers until its first token, and can end it
        assert (mode["response_body_mode"], mode["response_trailer_mode"]) == ("FULL_DUPLEX_STREAMED", "SEND")
    else:
        assert (mode["response_body_mode"], mode["response_trailer_mode"]) == ("NONE", "SKIP")
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (mapper,) = manager["local_reply_config"]["mappers"]
    flags, metadata = mapper["filter"]["and_filter"]["filters"]
    assert flags == {"response_flag_filter": {"flags": ["UT"]}}
    assert metadata["metadata_filter"]["match_if_key_not_found"] is False
    error = mapper["body_format_override"]["json_format"]["error"]
    assert error["code"] == "deadline_exceeded" and error["type"] == "GatewayTimeoutError"
    assert error["message"] == (
        "%DYNAMIC_METADATA(slorouter:deadline)% passed after %DURATION% ms without a first token; "
        "the router cancelled it"
    )


def test_no_hedge_policy_for_a_cluster_that_retries_on_the_same_endpoint():
    setup = EnvoySetup("127.0.0.1", 8080, "127.0.0.1", 9002, cluster="original_dst", hedges=True)
    config = bootstrap(setup)
    assert "hedge_policy" not in _route(config)["route"]
    assert (
        "local_reply_config"
        not in config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    )


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
