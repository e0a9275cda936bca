"""Header rules shared by every server and proxy here: hop-by-hop headers and entity tags."""

from __future__ import annotations

from collections.abc import Iterable

# Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection and are never forwarded by a proxy.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)


def not_forwarded(headers: Iterable[tuple[bytes, bytes]], always: frozenset[bytes]) -> frozenset[bytes]:
    """The lower-case header names a proxy must drop from ``headers``: ``always`` plus every name that a
    ``Connection`` header lists (RFC 9110 §7.6.1: those are hop-by-hop too, such as ``HTTP2-Settings``)."""
    listed: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            listed.update(token.strip().lower() for token in value.split(b","))
    listed.discard(b"")
    return always | listed if listed else always


def parse_etags(header: str | None) -> set[str]:
    """The entity tags of an ``If-None-Match`` header, unquoted (weak ones compare like strong ones here)."""
    if not header:
        return set()
    tags = set()
    for part in header.split(","):
        tag = part.strip()
        if tag.startswith("W/"):
            tag = tag[2:]
        if len(tag) >= 2 and tag[0] == tag[-1] == '"':
            tag = tag[1:-1]
        if tag:
            tags.add(tag)
    return tags
