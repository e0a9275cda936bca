"""Hop-by-hop rules: what a proxy never forwards."""

from __future__ import annotations

from slorouter.http.headers import HOP_BY_HOP, connection_listed, forwarded_lines

ALWAYS = HOP_BY_HOP | {b"host"}


def test_without_a_connection_header_only_the_fixed_set_is_dropped():
    assert forwarded_lines([(b"X-A", b"1"), (b"Host", b"h")], ALWAYS) == b"X-A: 1\r\n"


def test_names_listed_by_connection_headers_are_dropped_too():
    values = [b"keep-alive, X-Hop ,HTTP2-Settings", b"X-Other,,"]
    assert connection_listed(values) == {b"keep-alive", b"x-hop", b"http2-settings", b"x-other"}
    headers = [
        (b"X-Hop", b"1"),  # listed by a later Connection header: dropped all the same
        (b"Connection", values[0]),
        (b"X-Kept", b"2"),
        (b"connection", values[1]),
        (b"x-other", b"3"),
        (b"HTTP2-Settings", b"AAAA"),
    ]
    assert forwarded_lines(headers, ALWAYS) == b"X-Kept: 2\r\n"
