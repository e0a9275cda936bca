"""The ``tracing`` section (errors naming the key), the SDK imported only when tracing is on (a router
without the ``tracing`` extra starts; with tracing on it says which extra is missing), and the prediction
attributes of a pick."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from slorouter.config import ConfigError, parse_config
from slorouter.extras import install_hint
from slorouter.scheduling.plugin import TargetPrediction
from slorouter.scheduling.types import Route
from slorouter.serving.headers import RoutingFacts


def test_tracing_is_off_by_default_and_takes_the_originals_names():
    assert parse_config({}).tracing.enabled is False
    tracing = parse_config(
        {
            "tracing": {
                "enabled": True,
                "otelExporterEndpoint": "http://collector:4317",
                "sampling": {"sampler": "parentbased_traceidratio", "samplerArg": "0.25"},
                "serviceName": "epp",
            }
        }
    ).tracing
    assert (tracing.otel_exporter_endpoint, tracing.sampling.sampler_arg, tracing.service_name) == (
        "http://collector:4317",
        0.25,
        "epp",
    )


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"sampling": {"samplerArg": 2}}, "tracing.sampling.samplerArg"),
        ({"sampling": {"samplerArg": "often"}}, "tracing.sampling.samplerArg"),
        ({"sampling": {"sampler": "always_on"}}, "tracing.sampling.sampler"),
        ({"otelExporterEndpoint": "collector:4317"}, "tracing.otelExporterEndpoint"),
        ({"endpoint": "http://collector:4317"}, "tracing.endpoint"),
    ],
)
def test_errors_name_the_key(section: dict[str, Any], named: str):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        parse_config({"tracing": section})


_WITHOUT_SDK = """
import sys
sys.modules["opentelemetry"] = None  # as if the tracing extra were not installed
from slorouter.config import ConfigError, parse_config
from slorouter.gateway.runtime import Router
from slorouter.extproc.runtime import EndpointPicker, PickerPorts
pool = {"endpoints": ["127.0.0.1:9"]}
Router.build(parse_config({"pool": pool}))
EndpointPicker.build(parse_config({"pool": pool}), PickerPorts())
assert not any(m.startswith("opentelemetry.") for m in sys.modules), "imported with tracing off"
try:
    Router.build(parse_config({"pool": pool, "tracing": {"enabled": True}}))
except ConfigError as exc:
    print(exc)
"""


@pytest.mark.processes
def test_without_the_sdk_a_router_starts_with_tracing_off_and_names_the_extra_with_it_on():
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_SDK], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "tracing.enabled" in done.stdout
    assert install_hint("tracing") in done.stdout


_WITH_OVERWRITTEN_PROTOS = """
import sys, types
# What xds-protos leaves when it is installed after opentelemetry-proto: an old common_pb2 without
# InstrumentationScope.
sys.modules["opentelemetry.proto.common.v1.common_pb2"] = types.ModuleType(
    "opentelemetry.proto.common.v1.common_pb2"
)
from slorouter.config import ConfigError, parse_config
from slorouter.gateway.runtime import Router
tracing = {"enabled": True, "otelExporterEndpoint": "http://127.0.0.1:9"}
try:
    Router.build(parse_config({"pool": {"endpoints": ["127.0.0.1:9"]}, "tracing": tracing}))
except ConfigError as exc:
    print(exc)
"""


@pytest.mark.processes
def test_overwritten_otlp_protos_are_named_with_the_fix():
    done = subprocess.run(
        [sys.executable, "-c", _WITH_OVERWRITTEN_PROTOS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "tracing.enabled" in done.stdout
    assert "opentelemetry.proto.common.v1.common_pb2" in done.stdout
    assert "pip install --no-deps --force-reinstall opentelemetry-proto" in done.stdout


def test_a_predicted_pick_carries_its_predictions():
    lifecycle: Any = SimpleNamespace(
        target=SimpleNamespace(address="10.0.0.1:8000"),
        route=Route.PREDICTED,
        fallback_reason=None,
        prediction=TargetPrediction(ttft_ms=120.5, tpot_ms=8.25),
        admission=SimpleNamespace(ticket=None),
    )
    assert RoutingFacts.of(lifecycle).span_attributes() == {
        "slorouter.endpoint": "10.0.0.1:8000",
        "slorouter.route": "predicted",
        "slorouter.predicted_ttft_ms": 120.5,
        "slorouter.predicted_tpot_ms": 8.25,
    }
