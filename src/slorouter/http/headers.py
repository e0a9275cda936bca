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


def connection_listed(values: Iterable[bytes]) -> set[bytes]:
    """The lower-case header names that ``Connection`` header values list: hop-by-hop too (RFC 9110
    §7.6.1), such as ``HTTP2-Settings``."""
    listed = {token.strip().lower() for value in values for token in value.split(b",")}
    listed.discard(b"")
    return listed


def drop_listed(lines: list[bytes], listed: set[bytes]) -> list[bytes]:
    """Preformatted ``Name: value`` lines without those whose (lower-case) name is in ``listed``."""
    return [line for line in lines if line.split(b":", 1)[0].lower() not in listed]


def forwarded_lines(headers: Iterable[tuple[bytes, bytes]], never: frozenset[bytes]) -> bytes:
    """The ``Name: value`` lines of the headers a proxy passes on: none in ``never`` (lower-case names,
    ``connection`` among them) nor any a ``Connection`` header lists. One pass over the headers; the lines
    are filtered again only when a ``Connection`` header is there."""
    lines: list[bytes] = []
    connection: list[bytes] = []
    for name, value in headers:
        lower = name.lower()
        if lower in never:
            if lower == b"connection":
                connection.append(value)
            continue
        lines.append(b"%s: %s\r\n" % (name, value))
    if connection:
        lines = drop_listed(lines, connection_listed(connection))
    return b"".join(lines)


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
