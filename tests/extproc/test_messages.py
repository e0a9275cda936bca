"""Reading what Envoy sends: headers and the subset hint, for any value the data plane may put there."""

from __future__ import annotations

from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from slorouter.extproc import messages

_JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def _with_hint(value: Any) -> Any:
    request = pb.ProcessingRequest()
    hint = struct_pb2.Struct()
    hint.update({messages.SUBSET_KEY: value})
    request.metadata_context.filter_metadata[messages.SUBSET_NAMESPACE].CopyFrom(hint)
    return request


@given(st.lists(st.text(max_size=30), max_size=6))
def test_a_list_of_strings_is_read_as_endpoints(items: list[str]):
    expected = [p.strip() for item in items for p in item.split(",") if p.strip()]
    assert messages.subset_hint(_with_hint(items)) == expected


@given(_JSON)
def test_any_other_value_is_read_or_refused_by_name(value: Any):
    try:
        result = messages.subset_hint(_with_hint(value))
    except ValueError as exc:
        assert messages.SUBSET_KEY in str(exc)
    else:
        assert isinstance(result, list) and all(isinstance(item, str) and item for item in result)


def test_no_hint_is_none():
    assert messages.subset_hint(pb.ProcessingRequest()) is None


@given(st.dictionaries(st.text(min_size=1, max_size=12), st.binary(max_size=20), max_size=6))
def test_headers_are_read_lower_case_from_raw_values(headers: dict[str, bytes]):
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in headers.items()]
    )
    read = messages.header_map(pb.HttpHeaders(headers=header_map))
    for key in headers:
        assert read[key.lower()] in {
            v.decode("latin-1") for k, v in headers.items() if k.lower() == key.lower()
        }
    assert set(read) == {k.lower() for k in headers}
