"""The ext_proc messages of one Envoy stream, played through the picker (``PickerStream``) as Envoy sends
them: request headers (raw or string values, any body mode, subset hints of any shape, routing headers), the
body whole or in chunks (generated OpenAI bodies, valid and hostile), trailers, response headers with any
status and content type, response bodies (SSE, JSON, garbage), and streams out of order. A well-formed
request is routed; a bad one gets an ImmediateResponse with an OpenAI error body; a protocol violation is a
``ProtocolError``; nothing else is raised or logged, and no in-flight load is left once the stream closes.
``tests/extproc/test_messages.py`` has the properties of the message readers alone."""

from __future__ import annotations

from hypothesis import given, settings

from tests.fuzz.strategies import EXTPROC_CASES, ExtProcCase, check_extproc


@settings(max_examples=150, deadline=None)
@given(EXTPROC_CASES)
def test_generated_streams(case: ExtProcCase) -> None:
    check_extproc(case)
