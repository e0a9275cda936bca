"""Every command the README and docs/*.md show exists: ``slorouter`` subcommands and flags (the CLI's own
parser), ``benchmarks/`` scripts and their flags, ``make`` targets, and the repository files they name.
How commands are read and checked: tests/helpers/doc_commands.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.doc_commands import (
    Command,
    commands,
    doc_paths,
    fenced_blocks,
    inline_commands,
    inline_problems,
    logical_lines,
    problems,
    simple_commands,
    unwrap,
)


@pytest.mark.processes
def test_every_documented_command_exists() -> None:
    found = [command for path in doc_paths() for command in commands(path)]
    runners = [c for c in found if c.words and Path(c.words[0]).name == "slorouter"]
    assert len(runners) >= 15, "the docs' commands were not found: is the extraction broken?"
    bad = [f"{command.where()}: {'; '.join(p)}" for command in found if (p := problems(command))]
    inline = [command for path in doc_paths() for command in inline_commands(path)]
    assert len(inline) >= 30, "the docs' inline commands were not found: is the extraction broken?"
    bad += [f"{command.where()}: {'; '.join(p)}" for command in inline if (p := inline_problems(command))]
    assert bad == [], "commands in the docs that do not exist:\n" + "\n".join(bad)


MARKDOWN = """\
Text with `slorouter sim
--pods N` code, and `slorouter predictor training-server|prediction-server`.

```bash
# a comment line
PYTHONPATH=src nice -n 5 .venv/bin/slorouter sim --pods 2 \\
    --port 0   # a trailing comment
curl -s localhost:1/x -d '{"a":
  1}' | grep a && make run
env A=1 time python -m pytest tests/x.py::test_y > out.txt 2>&1
```

```
client ─▶ gateway (slorouter serve)
slorouter epp --config examples/serve.yaml
```

```yaml
slorouter: not a command
```
"""


def test_commands_are_read_whole_and_split_at_operators(tmp_path: Path) -> None:
    blocks = list(fenced_blocks(MARKDOWN))
    assert [(info, start) for info, start, _ in blocks] == [("bash", 5), ("", 14), ("yaml", 19)]
    lines = [(line, text) for line, text, _ in logical_lines(blocks[0][1], blocks[0][2])]
    assert [line for line, _ in lines] == [5, 6, 8, 10]
    assert (
        lines[1][1]
        == "PYTHONPATH=src nice -n 5 .venv/bin/slorouter sim --pods 2 --port 0 # a trailing comment"
    )
    _, _, tokens = next(iter(logical_lines(7, ['curl -s x -d \'{"a":', "  1}' | grep a && make run"])))
    assert tokens is not None
    assert list(simple_commands(tokens)) == [
        ["curl", "-s", "x", "-d", '{"a":\n  1}'],
        ["grep", "a"],
        ["make", "run"],
    ]
    assert unwrap(["PYTHONPATH=src", "nice", "-n", "5", "env", "A=1", "time", "slorouter", "sim"]) == [
        "slorouter",
        "sim",
    ]
    doc = tmp_path / "doc.md"
    doc.write_text(MARKDOWN, encoding="utf-8")
    assert [(c.line, c.words[:2]) for c in commands(doc, tmp_path)] == [
        (6, (".venv/bin/slorouter", "sim")),
        (8, ("curl", "-s")),
        (8, ("grep", "a")),
        (8, ("make", "run")),
        (10, ("python", "-m")),
        (15, ("slorouter", "epp")),  # an unlabelled block's command line, not its diagram
    ]
    inline = list(inline_commands(doc, tmp_path))
    assert [(c.line, c.text) for c in inline] == [
        (1, "slorouter sim --pods N"),
        (2, "slorouter predictor training-server|prediction-server"),
    ]
    assert [inline_problems(c) for c in inline] == [[], []]


@pytest.mark.processes
@pytest.mark.parametrize(
    ("words", "problem"),
    [
        (("slorouter", "serve", "--config", "examples/serve.yaml"), None),
        (("slorouter", "serve", "--workers", "2"), "unrecognized arguments: --workers 2"),
        (("slorouter", "route"), "invalid choice: 'route'"),
        (("slorouter", "predictor", "training-server", "--state-dir", "x"), None),
        (("slorouter", "serve", "--config", "examples/nope.yaml"), "examples/nope.yaml does not exist"),
        ((".venv/bin/python", "-m", "slorouter.cli", "sim", "--pods", "x"), "invalid"),
        (("python", "-m", "pytest", "tests/test_layering.py::test_x", "tests/nope/"), "tests/nope/ does not"),
        (("python", "benchmarks/kv_index_memory.py", "--pods", "3"), None),
        (("python", "benchmarks/kv_index_memory.py", "--pod", "3"), "kv_index_memory.py has no flag --pod"),
        (("python", "benchmarks/nope.py"), "benchmarks/nope.py does not exist"),
        (("make", "run", "ARGS=--port 0"), None),
        (("make", "serve"), "the Makefile has no target 'serve'"),
        (("/tmp/wrapper.sh", "slorouter", "sim"), "/tmp/wrapper.sh is not part of the repository"),
        (("kubectl", "logs", "deploy/epp"), None),  # a Kubernetes object, not a path
        (("kubectl", "apply", "-f", "deploy/nope.yaml"), "deploy/nope.yaml does not exist"),
        (("helm", "install", "x", "deploy/helm/nope"), "deploy/helm/nope does not exist"),
        (("curl", "-s", "localhost:8000/v1/models"), None),
    ],
)
def test_what_a_bad_command_is_reported_for(words: tuple[str, ...], problem: str | None) -> None:
    found = problems(Command("doc.md", 1, " ".join(words), words))
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize(
    ("span", "problem"),
    [
        ("slorouter epp --workers N", None),  # a flag shown with a placeholder for its value
        ("slorouter epp --worker N", "slorouter epp has no flag --worker"),
        (
            "slorouter predictor training-server|predict-server",
            "slorouter predictor has no subcommand 'predict-server'",
        ),
        ("slorouter route --config FILE", "slorouter has no subcommand 'route'"),
    ],
)
def test_what_a_bad_inline_command_is_reported_for(span: str, problem: str | None) -> None:
    found = inline_problems(Command("doc.md", 1, span, tuple(span.split())))
    assert found == ([] if problem is None else [problem])
