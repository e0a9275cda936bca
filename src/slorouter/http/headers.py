"""Header rules shared by every server and proxy here: entity tags."""

from __future__ import annotations


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
