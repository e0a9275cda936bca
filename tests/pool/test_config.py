from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from slorouter.pool.config import PoolConfig, endpoints_from_config
from slorouter.pool.state import Endpoint


def error_locations(data: dict[str, Any]) -> list[tuple[str | int, ...]]:
    with pytest.raises(ValidationError) as info:
        PoolConfig.model_validate(data)
    return [err["loc"] for err in info.value.errors()]


def test_bare_addresses_and_defaults() -> None:
    config = PoolConfig.model_validate({"endpoints": ["10.0.0.1:8000", "pod-b.ns.svc:8000", "[::1]:9000"]})
    assert [e.address for e in config.endpoints] == ["10.0.0.1:8000", "pod-b.ns.svc:8000", "[::1]:9000"]
    assert (config.scrape_interval_ms, config.scrape_timeout_ms, config.unhealthy_after_failures) == (
        50,
        1000,
        3,
    )
    assert (config.scrape_interval_s, config.scrape_timeout_s) == (0.05, 1.0)


def test_mapping_form_and_endpoints_from_config() -> None:
    config = PoolConfig.model_validate(
        {
            "endpoints": ["a:1", {"address": "b:2", "name": "pod-b", "labels": {"role": "decode"}}],
            "scrape_interval_ms": 10,
            "scrape_timeout_ms": 250,
            "unhealthy_after_failures": 5,
        }
    )
    assert endpoints_from_config(config) == [Endpoint("a:1"), Endpoint("b:2", "pod-b", {"role": "decode"})]


@pytest.mark.parametrize(
    "address",
    [
        "",
        ":8000",
        "host",
        "host:",
        "host:0",
        "host:65536",
        "host:abc",
        "host:-1",
        "http://host:80",
        "host:80/x",
        "ho st:80",
        "::1:80",
        "[::1:80",
        "[]:80",
        "host:٣",
    ],
)
def test_bad_addresses_name_the_field(address: str) -> None:
    assert error_locations({"endpoints": ["ok:1", address]}) == [("endpoints", 1, "address")]
    assert error_locations({"endpoints": [{"address": address}]}) == [("endpoints", 0, "address")]


def test_bad_address_message_says_what_is_wrong() -> None:
    with pytest.raises(
        ValidationError, match=r"endpoints\.0\.address[\s\S]*port must be an integer in 1-65535"
    ):
        PoolConfig.model_validate({"endpoints": ["host:70000"]})


def test_duplicates_are_rejected() -> None:
    with pytest.raises(ValidationError, match=r"endpoints\n.*duplicate endpoint address 'a:1'"):
        PoolConfig.model_validate({"endpoints": ["a:1", {"address": "a:1", "name": "again"}]})


@pytest.mark.parametrize(
    ("data", "location"),
    [
        ({"endpoints": []}, ("endpoints",)),
        ({}, ("endpoints",)),
        ({"endpoints": "a:1"}, ("endpoints",)),
        ({"endpoints": ["a:1"], "scrape_interval_ms": 0}, ("scrape_interval_ms",)),
        ({"endpoints": ["a:1"], "scrape_timeout_ms": -5}, ("scrape_timeout_ms",)),
        ({"endpoints": ["a:1"], "unhealthy_after_failures": 0}, ("unhealthy_after_failures",)),
        ({"endpoints": ["a:1"], "scrape_interval": 5}, ("scrape_interval",)),
        ({"endpoints": [{"address": "a:1", "weight": 2}]}, ("endpoints", 0, "weight")),
        ({"endpoints": [{"name": "no-address"}]}, ("endpoints", 0, "address")),
        ({"endpoints": [{"address": "a:1", "labels": {"k": 1}}]}, ("endpoints", 0, "labels", "k")),
    ],
)
def test_errors_name_the_field(data: dict[str, Any], location: tuple[str | int, ...]) -> None:
    assert error_locations(data) == [location]
