from __future__ import annotations

import math

import numpy as np
import pytest

from slorouter.predictor.features import (
    ALL_FEATURES,
    DEFAULT_SCHEMA,
    TPOT_FEATURES,
    TTFT_FEATURES,
    FeatureError,
    FeatureSchema,
    SchemaMismatchError,
    columns_to_matrix,
    columns_to_union_matrix,
    pod_class_code,
    rows_to_matrices,
    rows_to_matrix,
)


def row(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "kv_cache_percentage": 0.5,
        "input_token_length": 1000,
        "num_request_waiting": 2,
        "num_request_running": 10,
        "prefill_tokens_in_flight": 3000,
        "decode_tokens_in_flight": 20000,
        "prefix_cache_score": 0.25,
        "num_tokens_generated": 100,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not ...}


def test_column_orders_are_fixed() -> None:
    assert TTFT_FEATURES == (
        "kv_cache_percentage",
        "input_token_length",
        "num_request_waiting",
        "num_request_running",
        "prefill_tokens_in_flight",
        "decode_tokens_in_flight",
        "prefix_cache_score",
        "effective_input_tokens",
    )
    assert TPOT_FEATURES[-1] == "num_tokens_generated" and TPOT_FEATURES[:6] == TTFT_FEATURES[:6]
    assert set(ALL_FEATURES) == set(TTFT_FEATURES) | set(TPOT_FEATURES)


def test_matrix_layout_and_derived_column() -> None:
    X = rows_to_matrix([row(), row(prefix_cache_score=1.0)], "ttft")
    assert X.dtype == np.float32 and X.flags.c_contiguous and X.shape == (2, 8)
    assert X[0, 7] == pytest.approx(750.0) and X[1, 7] == 0.0
    given = rows_to_matrix([row(effective_input_tokens=10)], "ttft")
    assert given[0, 7] == 10.0
    mixed = rows_to_matrix([row(effective_input_tokens=10), row()], "ttft")
    assert mixed[:, 7].tolist() == [10.0, 750.0]
    tpot = rows_to_matrix([row()], "tpot")
    assert tpot.shape == (1, 7) and tpot[0, 6] == 100.0


def test_extra_keys_are_ignored_and_numpy_numbers_accepted() -> None:
    X = rows_to_matrix([row(model="ttft", pod_type="gpu", kv_cache_percentage=np.float32(0.5))], "ttft")
    assert X[0, 0] == 0.5


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"kv_cache_percentage": 1.7}, "rows[1].kv_cache_percentage: must be between 0 and 1, got 1.7"),
        ({"prefix_cache_score": -0.1}, "rows[1].prefix_cache_score: must be between 0 and 1, got -0.1"),
        ({"num_request_waiting": -1}, "rows[1].num_request_waiting: must be >= 0, got -1"),
        ({"input_token_length": True}, "rows[1].input_token_length: must be a number, got bool"),
        ({"input_token_length": "12"}, "rows[1].input_token_length: must be a number, got str"),
        ({"decode_tokens_in_flight": math.nan}, "rows[1].decode_tokens_in_flight: must be finite, got nan"),
        ({"num_request_running": math.inf}, "rows[1].num_request_running: must be finite, got inf"),
        ({"num_request_running": None}, "rows[1].num_request_running: required field is missing"),
        ({"prefill_tokens_in_flight": ...}, "rows[1].prefill_tokens_in_flight: required field is missing"),
        ({"input_token_length": 10**400}, "rows[1].input_token_length: must be at most"),
        ({"effective_input_tokens": -5}, "rows[1].effective_input_tokens: must be >= 0, got -5"),
    ],
)
def test_every_error_names_row_and_field(bad: dict[str, object], message: str) -> None:
    rows = [row(), row(**bad), row(kv_cache_percentage=9)]  # the first bad row is reported
    with pytest.raises(FeatureError) as info:
        rows_to_matrix(rows, "ttft")
    assert str(info.value).startswith(message)
    assert info.value.index == 1 and info.value.field == str(message.split(".")[1].split(":")[0])


def test_error_locations_follow_where_and_indices() -> None:
    with pytest.raises(FeatureError, match=r"^samples\[3\]\.features\.kv_cache_percentage: must be between"):
        rows_to_matrix([row(kv_cache_percentage=1.7)], "tpot", where="samples[{i}].features", indices=[3])
    with pytest.raises(FeatureError, match=r"^samples\[0\]: must be an object"):
        rows_to_matrix([[1, 2]], "ttft", where="samples")  # type: ignore[list-item]
    with pytest.raises(FeatureError, match=r"^rows\[0\]\.num_tokens_generated: required field is missing"):
        rows_to_matrix([row(num_tokens_generated=...)], "tpot")
    rows_to_matrix([row(num_tokens_generated=...)], "ttft")  # not a TTFT feature


def test_rows_to_matrices_validates_the_union_once() -> None:
    x_ttft, x_tpot = rows_to_matrices([row(), row()])
    assert x_ttft.shape == (2, 8) and x_tpot.shape == (2, 7)
    with pytest.raises(FeatureError, match=r"rows\[0\]\.num_tokens_generated"):
        rows_to_matrices([row(num_tokens_generated=-1)])


def test_columns_path_matches_rows_path_and_broadcasts() -> None:
    rows = [row(kv_cache_percentage=0.1 * i, num_request_running=i) for i in range(5)]
    columns = {name: np.array([r[name] for r in rows], dtype=np.float64) for name in rows[0]}
    columns["input_token_length"] = 1000  # type: ignore[assignment]  # a per-request scalar
    for kind in ("ttft", "tpot"):
        np.testing.assert_array_equal(columns_to_matrix(columns, kind), rows_to_matrix(rows, kind))
    del columns["num_request_running"]
    with pytest.raises(FeatureError, match=r"columns\.num_request_running"):
        columns_to_matrix(columns, "ttft")


def test_union_matrix_holds_both_models_columns() -> None:
    rows = [row(kv_cache_percentage=0.1 * i, num_request_running=i) for i in range(5)]
    columns = {name: np.array([r[name] for r in rows], dtype=np.float64) for name in rows[0]}
    for schema in (DEFAULT_SCHEMA, FeatureSchema(pod_class=True)):
        if schema.pod_class:
            columns["pod_class"] = np.arange(5, dtype=np.float64)
        union = columns_to_union_matrix(columns, schema=schema)
        assert union.shape == (5, len(schema.all_features())) and union.flags.c_contiguous
        for kind in ("ttft", "tpot"):
            expected = columns_to_matrix(columns, kind, schema=schema)
            np.testing.assert_array_equal(union[:, schema.union_columns(kind)], expected)
    assert DEFAULT_SCHEMA.union_columns("ttft") == slice(0, 8)
    assert DEFAULT_SCHEMA.union_columns("tpot") == [0, 1, 2, 3, 4, 5, 8]


def test_schema_round_trip_and_mismatch() -> None:
    stored = DEFAULT_SCHEMA.to_dict()
    assert FeatureSchema.from_dict(stored) == DEFAULT_SCHEMA
    DEFAULT_SCHEMA.check(stored)
    with pytest.raises(SchemaMismatchError, match="trained on feature schema"):
        FeatureSchema(pod_class=True).check(stored)
    with pytest.raises(SchemaMismatchError):
        DEFAULT_SCHEMA.check({**stored, "version": 0})


def test_pod_class_column_and_codes() -> None:
    schema = FeatureSchema(pod_class=True)
    assert schema.features("ttft")[-1] == "pod_class" and schema.features("tpot")[-1] == "pod_class"
    assert pod_class_code("") == 0 and pod_class_code(None) == 0
    assert pod_class_code("H100") == pod_class_code("H100") != pod_class_code("A100")
    assert 0 < pod_class_code("A100") < 2**24
    X = rows_to_matrix([row(pod_class=pod_class_code("A100"))], "tpot", schema=schema)
    assert X[0, -1] == pod_class_code("A100")
    with pytest.raises(FeatureError, match=r"rows\[0\]\.pod_class: must be an integer code"):
        rows_to_matrix([row(pod_class=1.5)], "ttft", schema=schema)
    with pytest.raises(FeatureError, match=r"rows\[0\]\.pod_class: required field is missing"):
        rows_to_matrix([row()], "ttft", schema=schema)
