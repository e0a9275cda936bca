"""The docs index (docs/README.md) reaches every page, and every relative link of the docs and the README
points at a file that exists (and, with a ``#fragment``, at a heading of it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # a "# comment" in a code block is no heading
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_the_index_links_every_page() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = {target.split("#")[0] for target in LINK.findall(index)}
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages - linked == set(), "docs pages the index does not link"


def test_relative_links_point_at_files_and_headings_that_exist() -> None:
    broken = []
    for document in [ROOT / "README.md", *DOCS.glob("*.md"), *(DOCS / "design").glob("*.md")]:
        for target in LINK.findall(document.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path, _, fragment = target.partition("#")
            resolved = (document.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target}")
            elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
