"""The routing headers (SLOs, inference objective, prediction opt-in) on generated values: any Latin-1 or
Unicode text, numbers of every spelling, NaN, infinities, values beyond an hour. Valid headers give hints in
range; a bad one is a 400 naming the header; nothing else is raised (``tests/api/test_routing_headers.py``
has the examples)."""

from __future__ import annotations

from hypothesis import given, settings

from tests.fuzz.strategies import HEADERS_CASES, HeadersCase, check_headers


@settings(max_examples=300, deadline=None)
@given(HEADERS_CASES)
def test_generated_routing_headers(case: HeadersCase) -> None:
    check_headers(case)
