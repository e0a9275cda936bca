"""No module under tests/ imports from a test module (``test_*.py``): what tests share is in tests/helpers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.source import imported_from

TESTS = Path(__file__).resolve().parent


def imported_modules(text: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute name) of every module that ``module``'s source imports from, or imports."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(node, module)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]  # `from pkg import mod`
    return found


def imports_of_test_modules(text: str, module: str) -> list[str]:
    return [
        f"line {line}: {name}"
        for line, name in imported_modules(text, module)
        if name.startswith("tests.") and name.rsplit(".", 1)[1].startswith("test_")
    ]


SOURCES = sorted(TESTS.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_module_imports_a_test_module(path: Path) -> None:
    module = ".".join(["tests", *path.relative_to(TESTS).with_suffix("").parts])
    assert imports_of_test_modules(path.read_text(encoding="utf-8"), module) == []


def test_the_check_catches_absolute_relative_and_module_imports() -> None:
    source = (
        "from tests.gateway.test_warm_restart import stop\n"
        "from .test_list_path import bits\n"
        "from tests.predictor import test_client as client\n"
        "from tests.helpers.processes import free_port\n"
        "from .conftest import make_pool\n"
    )
    assert imports_of_test_modules(source, "tests.scheduling.test_x") == [
        "line 1: tests.gateway.test_warm_restart",
        "line 2: tests.scheduling.test_list_path",
        "line 3: tests.predictor.test_client",
    ]
