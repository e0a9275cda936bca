"""The documentation, code, benchmarks and tests speak of the product as it is, not of the work that made it.

Tracker numbers ("issue 12", "#42"), work-session numbers ("session 7") and work-log phrasing ("this
session's code", "we tried") belong in git history and design notes, not in the files a user or a new
maintainer reads. The patterns are narrow on purpose: "session" as an HTTP or workload session, "issue" as
a verb and upstream references such as "llm-d PR #1651" are fine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ("docs", "src", "benchmarks", "tests", "examples")
FILES = ("README.md", "CHANGELOG.md")
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".txt", ".json", ".sh", ".cfg", ".ini"}
THIS_FILE = Path(__file__).resolve()

_LOG_SESSION = r"(?:this|that|the last|last|the previous|previous|the next|next|the same)"
PATTERNS: dict[str, re.Pattern[str]] = {
    # "issue 12", "issue-5 grid", "Issue #3", "issues 11"
    "issue number": re.compile(r"\bissues?[-\s]#?\d+", re.IGNORECASE),
    # "session 7", "sessions 8–9", "Session-3"; a workload's prompt tag "[session 40 turn 3]" is not one
    "session number": re.compile(r"(?<!\[)\bsessions?[-\s]\d+", re.IGNORECASE),
    # "#42" as a tracker reference; "PR #1651", "pull request #1827", "owner/repo#12" and "&#123;" are not
    "issue reference": re.compile(
        r"(?<![\w/&#])(?<!PR )(?<!pull request )#\d{1,5}\b(?![\w-])", re.IGNORECASE
    ),
    "work-log phrasing": re.compile(
        rf"\b(?:in|during|of|from|since|until|before|after|for) {_LOG_SESSION} session\b"
        r"|\b(?:last|previous|next) session\b"
        r"|\bthis session's (?:code|changes?|measurements?|work|figures?|tree|runs?|table)\b"
        r"|\bwe (?:tried|measured|found|decided)\b"
        r"|\bthe issue's\b"
        r"|\bissue's (?:targets?|rule|table|workloads|grid)\b",
        re.IGNORECASE,
    ),
}


def findings(text: str) -> list[tuple[str, str]]:
    """(kind, matched text) for every flagged phrase; lines are joined so a phrase may span a line break."""
    flat = re.sub(r"\s+", " ", text)
    return [(kind, m.group(0)) for kind, pattern in PATTERNS.items() for m in pattern.finditer(flat)]


def _files() -> list[Path]:
    paths = [ROOT / name for name in FILES if (ROOT / name).is_file()]
    for tree in TREES:
        base = ROOT / tree
        if base.is_dir():
            paths += sorted(
                p
                for p in base.rglob("*")
                if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
            )
    return [p for p in paths if p.resolve() != THIS_FILE]


@pytest.mark.parametrize(
    "text",
    [
        "Issue 12, session 7: the load-core pipeline",
        "on the issue-5 grid",
        "see issue #3",
        "measured in sessions 8–9",
        "fixed in #42.",
        "the figures of this session's code",
        "Measured in this session, before the change",
        "as the last session found",
        "we tried a band filter",
        "the issue's targets are not met",
        "Session\n3: joint pass",
    ],
)
def test_flags_tracker_and_work_log_phrases(text: str) -> None:
    assert findings(text), text


@pytest.mark.parametrize(
    "text",
    [
        "async with aiohttp.ClientSession() as session: await session.get(url)",
        "the client session is closed after the last request; this session object is reused",
        "a conversation's turns: `[session 40 turn 3]`",
        "mean seconds between turns of a session (open sessions = qps × duration)",
        "requests in a session",
        "The router issues a request to every pod; it issued 3 retries",
        "llm-d PR #1651, GIE PR #1827, llm-d/llm-d#123 and the HTML entity &#38;",
        "colour #1f77b4, anchors like (#the-ext_proc-picker), `# 2 comments`",
        "a tissue 12 times",
    ],
)
def test_leaves_legitimate_words_alone(text: str) -> None:
    assert not findings(text), findings(text)


def test_no_tracker_numbers_or_work_log_phrasing() -> None:
    problems = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for kind, phrase in findings(text):
            problems.append(f"{path.relative_to(ROOT)}: {kind}: {phrase!r}")
    assert not problems, "\n".join(problems)


def test_excludes_itself() -> None:
    assert THIS_FILE not in {p.resolve() for p in _files()}
    assert findings(THIS_FILE.read_text(encoding="utf-8"))  # its own examples would fail the scan
