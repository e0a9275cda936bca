"""The predictor servers' bodies on generated input: the training server's ``POST /v1/samples`` and the
prediction server's bulk rows, JSON and binary. Valid bodies are accepted whole (binary and JSON rows
decode to the matrix that was encoded; the JSON fast path agrees with the library's validation); a bad
sample, row, value or header gets a 400 (413 over a limit) naming it; nothing else is raised. Then the
regressions of the defects the fuzzing found (docs/reliability.md, "Fuzzing")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from slorouter.http.errors import RequestError
from slorouter.http.json_bodies import parse_json
from slorouter.predictor.features import DEFAULT_SCHEMA
from slorouter.predictor.training_server import parse_samples
from tests.fuzz.strategies import BULK_CASES, SAMPLES_CASES, BulkCase, SamplesCase, check_bulk, check_samples


@settings(max_examples=200, deadline=None)
@given(SAMPLES_CASES)
def test_generated_sample_bodies(case: SamplesCase) -> None:
    check_samples(case)


@settings(max_examples=200, deadline=None)
@given(BULK_CASES)
def test_generated_bulk_bodies(case: BulkCase) -> None:
    check_bulk(case)


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000 + b"]" * 100_000, b'{"rows": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001],
    ids=["arrays", "objects"],
)
def test_a_body_nested_too_deeply_is_a_400_not_a_crash(raw):
    with pytest.raises(RequestError, match="nested too deeply") as info:
        parse_json(raw)
    assert info.value.status == 400


@pytest.mark.parametrize("model", [{}, [], ["ttft"], {"ttft": 1}])
def test_a_sample_whose_model_is_an_object_or_array_is_a_400_naming_it(model):
    # `kind not in rows` raised TypeError (unhashable) for these: a 500 from POST /v1/samples.
    body = {"schema": DEFAULT_SCHEMA.key(), "samples": [{"model": model, "features": {}, "latency_ms": 1}]}
    with pytest.raises(RequestError, match=r"samples\[0\].model: must be one of") as info:
        parse_samples(body, schema=DEFAULT_SCHEMA)
    assert (info.value.status, info.value.param) == (400, "samples[0].model")
