"""The shell commands shown in the Markdown docs, and what is wrong with each against the repository.

``commands(path)`` reads a document's fenced shell blocks (``bash``, ``sh``, ``shell``, ``console``; in an
unlabelled block, only the lines that run ``slorouter``, Python or ``make``) into logical lines (``\\``
continuations and quotes spanning lines joined, comments dropped), each split at pipes, ``&&``, ``;`` and
``&`` into simple commands without their ``NAME=value`` prefixes and wrappers (``env``, ``nice``, ``time``).
``problems(command)`` checks one: a ``slorouter`` command (``.venv/bin/slorouter``, ``python -m
slorouter.cli``) against the parser ``slorouter.cli`` builds, a ``benchmarks/`` script's flags against its
``--help``, ``make`` targets against the Makefile, and every path into the repository (``--config
examples/x.yaml``, ``tests/...``, ``deploy/...``) for existence. ``curl``, ``helm``, ``kubectl`` and other
tools have only their repository paths checked. ``inline_commands(path)`` reads the ``slorouter ...`` code
spans of the prose, which often show a flag without its value (``slorouter epp --workers N``): only their
subcommands and flags are checked (``inline_problems``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import itertools
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from slorouter import cli

ROOT = Path(__file__).resolve().parents[2]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OPERATOR = re.compile(r"^[;&|()<>]+$")
PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
GENERATED = (".venv/", "./.venv/")  # made by `make`, not in the repository


@dataclass(frozen=True, slots=True)
class Command:
    """One simple command of a document: where it is, the logical line it is part of, and its words."""

    path: str  # relative to the repository
    line: int  # where its logical line starts
    text: str  # the logical line, on one line
    words: tuple[str, ...]  # program and arguments, prefixes and wrappers removed

    def where(self) -> str:
        return f"{self.path}:{self.line}: `{self.text}`"


def fenced_blocks(markdown: str) -> Iterator[tuple[str, int, list[str]]]:
    """(info string, line number of the block's first line, its lines) of every fenced block."""
    fence: str | None = None
    info, start, lines = "", 0, list[str]()
    for number, line in enumerate(markdown.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence, info, start, lines = match.group(1), match.group(2).lower(), number + 1, []
        elif match and match.group(1).startswith(fence) and not match.group(2):
            yield info, start, lines
            fence = None
        else:
            lines.append(line)


def _lex(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def logical_lines(start: int, lines: list[str]) -> Iterator[tuple[int, str, list[str] | None]]:
    """(line number, text, tokens) of each logical line: continuations joined, and lines inside an open
    quote; tokens None when the block ends inside a quote."""
    text, first = "", start
    for number, line in enumerate(lines, start):
        if not text:
            first = number
            line = line.strip().removeprefix("$ ")
        if line.rstrip().endswith("\\"):
            text += line.rstrip()[:-1] + " "
            continue
        text += line
        try:
            tokens = _lex(text)
        except ValueError:  # a quote left open: the next line continues it
            text += "\n"
            continue
        yield first, " ".join(text.split()), tokens
        text = ""
    if text.strip():
        yield first, " ".join(text.split()), None


def simple_commands(tokens: list[str]) -> Iterator[list[str]]:
    """The words of each simple command of a logical line, split at its operators (a redirection's file is
    dropped)."""
    words: list[str] = []
    redirect = False
    for token in tokens:
        if OPERATOR.match(token):
            if "<" in token or ">" in token:
                redirect = "&" not in token  # ``2>&1`` names no file
            else:
                if words:
                    yield words
                words = []
            continue
        if redirect:
            redirect = False
            continue
        words.append(token)
    if words:
        yield words


def unwrap(words: list[str]) -> list[str]:
    """``words`` without ``NAME=value`` prefixes and the wrappers ``env``, ``nice [-n N]``, ``time``."""
    words = list(words)
    while words:
        if ASSIGNMENT.match(words[0]) or words[0] in ("env", "time", "exec"):
            words.pop(0)
        elif words[0] == "nice":
            words.pop(0)
            if words[:1] == ["-n"]:
                del words[:2]
            elif words and re.match(r"^-\d+$", words[0]):
                words.pop(0)
        else:
            break
    return words


def _is_runner(words: list[str]) -> bool:
    program = words[0]
    return (
        program == "make"
        or Path(program).name == "slorouter"
        or bool(PYTHON.match(Path(program).name))
        or program.startswith(("benchmarks/", "./benchmarks/"))
    )


def commands(path: Path, root: Path = ROOT) -> Iterator[Command]:
    """Every simple command of ``path``'s shell blocks (and the runnable lines of its unlabelled ones), named
    by its path relative to ``root``."""
    relative = str(path.relative_to(root))
    for info, start, lines in fenced_blocks(path.read_text(encoding="utf-8")):
        if info not in SHELL_BLOCKS and info != "":
            continue
        for line, text, tokens in logical_lines(start, lines):
            if tokens is None:
                if info:
                    yield Command(relative, line, text, ())  # reported: a quote left open
                continue
            simple = [words for words in map(unwrap, simple_commands(tokens)) if words]
            if simple and (info or _is_runner(simple[0])):  # not a diagram's line naming a command
                yield from (Command(relative, line, text, tuple(words)) for words in simple)


INLINE = re.compile(r"(?<!`)`((?:\.venv/bin/)?slorouter [^`]+)`(?!`)")


def _prose(markdown: str) -> str:
    """``markdown`` with the lines of its fenced blocks (fences included) blanked, so line numbers hold."""
    lines = markdown.splitlines()
    fence: str | None = None
    for number, line in enumerate(lines):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and match and match.group(1).startswith(fence) and not match.group(2):
            fence = None
        elif fence is None:
            continue
        lines[number] = ""
    return "\n".join(lines)


def inline_commands(path: Path, root: Path = ROOT) -> Iterator[Command]:
    """The ``slorouter ...`` code spans of ``path`` outside its fenced blocks."""
    text = _prose(path.read_text(encoding="utf-8"))
    for match in INLINE.finditer(text):
        span = " ".join(match.group(1).split())
        try:
            words = tuple(shlex.split(span))
        except ValueError:
            continue
        line = text.count("\n", 0, match.start()) + 1
        yield Command(str(path.relative_to(root)), line, span, words)


# -- checks ----------------------------------------------------------------------------------------------


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return cli.build_parser()


def slorouter_problem(args: list[str]) -> str | None:
    """What the ``slorouter`` parser says of ``args`` (an unknown subcommand or flag, a bad value), if
    anything."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            _parser().parse_args(args)
        except SystemExit as exc:
            if exc.code:
                return stderr.getvalue().strip().splitlines()[-1]
    return None


def inline_problems(command: Command) -> list[str]:
    """The subcommands and flags of an inline ``slorouter ...`` that its parser does not have (``a|b``:
    either subcommand)."""
    return _flag_problems(_parser(), list(command.words[1:]))


def _flag_problems(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    choices = _subcommands(parser)
    if choices is not None and words:
        found = []
        for name in words[0].split("|"):
            if name not in choices:
                found.append(f"{parser.prog} has no subcommand {name!r}")
            else:
                found += _flag_problems(choices[name], words[1:])
        return found
    flags = [word.split("=", 1)[0] for word in words if re.match(r"^--?[A-Za-z]", word)]
    return [
        f"{parser.prog} has no flag {flag}" for flag in flags if flag not in parser._option_string_actions
    ]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


@functools.cache
def script_flags(script: str) -> frozenset[str] | None:
    """The option strings of a script's argparse parser, from one ``--help``; None if it has none."""
    result = subprocess.run(
        [sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0 or not result.stdout.startswith("usage:"):
        return None
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", result.stdout))


@functools.cache
def make_targets() -> frozenset[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return frozenset(targets)


@functools.cache
def _top_level() -> frozenset[str]:
    return frozenset(p.name for p in ROOT.iterdir() if not p.name.startswith("."))


def _path_words(program: str, args: list[str]) -> list[str]:
    """The words of a command that may be repository paths: kubectl's ``-f`` files only (its ``deploy/x``
    are objects), none of curl's (URLs)."""
    if program == "curl":
        return []
    if program == "kubectl":
        return [value for flag, value in itertools.pairwise(args) if flag in ("-f", "--filename")]
    return args


def path_problems(words: list[str]) -> list[str]:
    """Repository paths among ``words`` (or their ``--flag=`` values) that do not exist."""
    found = []
    for word in words:
        value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
        value = value.split("::", 1)[0].removeprefix("./")
        if "/" not in value or "://" in value or value.startswith(("/", "~", "$")):
            continue
        if value.split("/", 1)[0] not in _top_level():
            continue  # an output directory, or not a path at all
        matches = list(ROOT.glob(value.rstrip("/"))) if any(c in value for c in "*?[") else [ROOT / value]
        if not any(p.exists() for p in matches):
            found.append(f"{value} does not exist in the repository")
    return found


def _script_problems(script: str, args: list[str]) -> list[str]:
    flags = script_flags(script)
    if flags is None:
        return [f"{script} --help shows no argparse usage"]
    used = [arg.split("=", 1)[0] for arg in args if re.match(r"^--?[A-Za-z]", arg)]
    return [f"{script} has no flag {flag}" for flag in used if flag not in flags]


def problems(command: Command) -> list[str]:
    """What is wrong with one command; empty when nothing is."""
    if not command.words:
        return ["a quote is left open"]
    program, *args = command.words
    found = path_problems(_path_words(program, args))
    name = Path(program).name
    if name == "slorouter":
        found += [problem] if (problem := slorouter_problem(args)) else []
    elif PYTHON.match(name):
        if args[:2] in (["-m", "slorouter"], ["-m", "slorouter.cli"]):
            found += [problem] if (problem := slorouter_problem(args[2:])) else []
        elif args and not args[0].startswith("-"):
            script = args[0].removeprefix("./")
            if script.startswith("benchmarks/") and (ROOT / script).is_file():
                found += _script_problems(script, args[1:])
    elif name == "make":
        targets = [arg for arg in args if not arg.startswith("-") and "=" not in arg]
        found += [f"the Makefile has no target {t!r}" for t in targets if t not in make_targets()]
    if "/" in program and not program.startswith(GENERATED):
        relative = program.removeprefix("./")
        if program.startswith("/") or not (ROOT / relative).exists():
            found.append(f"{program} is not part of the repository")
        elif relative.startswith("benchmarks/"):
            found += _script_problems(relative, args)
    return found


def doc_paths() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
