"""Routing headers: SLOs, objectives and the prediction opt-in; every bad value is a 400 naming the header."""

from __future__ import annotations

import pytest

from slorouter.api.routing_headers import parse_routing_headers
from slorouter.http.errors import RequestError

OBJECTIVES = {"premium": 10, "batch": -1}


def _parse(headers, default=False):
    return parse_routing_headers(headers, OBJECTIVES, prediction_by_default=default)


def test_no_headers():
    hints = _parse({})
    assert (hints.slo_ttft_ms, hints.slo_tpot_ms, hints.priority, hints.use_prediction) == (
        None,
        None,
        0,
        False,
    )


def test_slos_and_objective():
    hints = _parse(
        {"x-slo-ttft-ms": "500", "x-slo-tpot-ms": " 50.5 ", "x-gateway-inference-objective": "batch"}
    )
    assert hints.slo_ttft_ms == 500.0
    assert hints.slo_tpot_ms == 50.5
    assert hints.priority == -1
    assert hints.objective == "batch"


def test_one_slo_leaves_the_other_unset():
    hints = _parse({"x-slo-ttft-ms": "300"})
    assert hints.slo_ttft_ms == 300.0 and hints.slo_tpot_ms is None


def test_llm_d_header_aliases():
    hints = _parse({"x-llm-d-slo-ttft-ms": "200", "x-llm-d-inference-objective": "premium"})
    assert hints.slo_ttft_ms == 200.0 and hints.priority == 10
    hints = _parse({"x-llm-d-slo-tpot-ms": "20"})
    assert hints.slo_tpot_ms == 20.0 and hints.slo_ttft_ms is None


def test_the_llm_d_slo_names_win_over_the_older_ones():
    hints = _parse({"x-slo-ttft-ms": "900", "x-llm-d-slo-ttft-ms": "300",
                    "x-slo-tpot-ms": "90", "x-llm-d-slo-tpot-ms": "30"})  # fmt: skip
    assert (hints.slo_ttft_ms, hints.slo_tpot_ms) == (300.0, 30.0)
    # The one that wins is the one validated (and named in the error).
    with pytest.raises(RequestError, match="x-llm-d-slo-ttft-ms"):
        _parse({"x-slo-ttft-ms": "900", "x-llm-d-slo-ttft-ms": "soon"})


@pytest.mark.parametrize(
    ("headers", "default", "expected"),
    [
        ({}, True, True),
        ({"x-prediction-based-scheduling": "true"}, False, True),
        ({"x-prediction-based-scheduling": "FALSE"}, True, False),
        ({"x-prediction-based-scheduling-off": ""}, True, False),
    ],
)
def test_prediction_opt_in_and_out(headers, default, expected):
    assert _parse(headers, default).use_prediction is expected


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({"x-slo-ttft-ms": "fast"}, "x-slo-ttft-ms"),
        ({"x-slo-ttft-ms": "-5"}, "x-slo-ttft-ms"),
        ({"x-slo-ttft-ms": "0"}, "x-slo-ttft-ms"),
        ({"x-slo-tpot-ms": "nan"}, "x-slo-tpot-ms"),
        ({"x-slo-tpot-ms": "inf"}, "x-slo-tpot-ms"),
        ({"x-slo-ttft-ms": "1e12"}, "more than an hour"),
        ({"x-gateway-inference-objective": "gold"}, "unknown inference objective 'gold'"),
        ({"x-prediction-based-scheduling": "maybe"}, "x-prediction-based-scheduling"),
    ],
)
def test_bad_headers_are_400s_naming_the_header(headers, needle):
    with pytest.raises(RequestError) as info:
        _parse(headers)
    assert info.value.status == 400
    assert needle in info.value.message
