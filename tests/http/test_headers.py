"""Hop-by-hop rules: what a proxy never forwards."""

from __future__ import annotations

from slorouter.http.headers import HOP_BY_HOP, not_forwarded

ALWAYS = HOP_BY_HOP | {b"host"}


def test_without_a_connection_header_only_the_fixed_set_is_dropped():
    assert not_forwarded([(b"X-A", b"1"), (b"Host", b"h")], ALWAYS) is ALWAYS


def test_names_listed_by_connection_headers_are_dropped_too():
    headers = [(b"Connection", b"keep-alive, X-Hop ,HTTP2-Settings"), (b"connection", b"X-Other,,")]
    assert not_forwarded(headers, ALWAYS) == ALWAYS | {b"keep-alive", b"x-hop", b"http2-settings", b"x-other"}
