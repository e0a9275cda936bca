"""Every test that starts a real process has the ``processes`` marker (``make test-fast`` leaves them out).

A test starts processes when it uses ``subprocess``, ``asyncio.create_subprocess_*`` or the router's own
process starters (``EnvoyProcess``, ``WorkerPool``), or something that does: a function or class of its
module, a name it imports from a module under tests/ (the helpers, a conftest), or a fixture it asks for (its
module's, or a conftest.py's above it). This is read from the source (the AST), transitively; the test, its
class or its module (``pytestmark``) must then have the marker.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.source import imported_from

TESTS = Path(__file__).resolve().parent
MARKER = "processes"
# What starts a process: the standard library's ways, and the router's (slorouter.extproc).
DIRECT = {"subprocess", "create_subprocess_exec", "create_subprocess_shell", "EnvoyProcess", "WorkerPool"}

Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _is_fixture(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
    return False


def _marks(nodes: list[ast.expr]) -> bool:
    """Whether ``nodes`` (decorators, or a ``pytestmark`` value) hold ``pytest.mark.processes``."""
    return any(
        isinstance(inner, ast.Attribute)
        and inner.attr == MARKER
        and isinstance(inner.value, ast.Attribute)
        and inner.value.attr == "mark"
        for node in nodes
        for inner in ast.walk(node)
    )


def _pytestmark(body: list[ast.stmt]) -> bool:
    return any(
        isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
        and _marks([s.value])
        for s in body
    )  # fmt: skip


@dataclass
class Module:
    name: str  # tests.x.y
    path: Path
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level functions, classes, assignments
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name: (module, name)
    aliases: dict[str, str] = field(default_factory=dict)  # local name: module

    def __post_init__(self) -> None:
        for node in self.tree.body:
            if isinstance(node, Def):
                self.defs[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.defs[target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                base = imported_from(node, self.name)
                for alias in node.names:
                    local = alias.asname or alias.name
                    if base.startswith("tests"):
                        self.imported[local] = (base, alias.name)
                        self.aliases[local] = f"{base}.{alias.name}"  # in case it is a module
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tests.") and alias.asname:
                        self.aliases[alias.asname] = alias.name


class Processes:
    """Which tests start processes, and through what."""

    def __init__(self, root: Path = TESTS) -> None:
        self.root = root
        self.modules: dict[str, Module] = {}
        self.memo: dict[tuple[str, str], str | None] = {}

    def add(self, name: str, path: Path, text: str) -> Module:
        module = Module(name, path, ast.parse(text))
        self.modules[name] = module
        return module

    def module(self, name: str) -> Module | None:
        if name not in self.modules:
            relative = Path(*name.split(".")[1:])
            for path in (self.root / relative.with_suffix(".py"), self.root / relative / "__init__.py"):
                if path.is_file():
                    return self.add(name, path, path.read_text(encoding="utf-8"))
            return None
        return self.modules[name]

    def conftests(self, module: Module) -> list[Module]:
        """The conftest.py modules that apply to ``module``, nearest first."""
        found = []
        directory = module.path.parent
        while directory == self.root or self.root in directory.parents:
            relative = directory.relative_to(self.root).parts
            conftest = self.module(".".join(["tests", *relative, "conftest"]))
            if conftest is not None and conftest is not module:
                found.append(conftest)
            directory = directory.parent
        return found

    def fixture(self, module: Module, name: str) -> tuple[Module, str] | None:
        """Where the fixture ``name`` that ``module``'s tests get is defined (or bound, or imported)."""
        for owner in [module, *self.conftests(module)]:
            node = owner.defs.get(name)
            if node is not None and (_is_fixture(node) or isinstance(node, ast.Attribute | ast.Name)):
                return owner, name
            if node is None and name in owner.imported:
                return owner, name
        return None

    def why(self, module: Module, name: str) -> str | None:
        """How ``module``'s top-level ``name`` starts processes (a chain of names), or None."""
        key = (module.name, name)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = None  # a cycle starts nothing by itself
        if name in module.defs:
            reason = self.uses(module, module.defs[name])
            self.memo[key] = None if reason is None else f"{name} → {reason}"
        elif name in module.imported:
            target = self.module(module.imported[name][0])
            self.memo[key] = self.why(target, module.imported[name][1]) if target is not None else None
        return self.memo[key]

    def uses(self, module: Module, node: ast.AST) -> str | None:
        """How the code of ``node`` (in ``module``) starts processes, or None."""
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and inner.id in DIRECT:
                return inner.id
            if isinstance(inner, ast.Attribute) and inner.attr in DIRECT:
                return inner.attr
            if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name):
                alias = module.aliases.get(inner.value.id)
                target = self.module(alias) if alias is not None else None
                reason = self.why(target, inner.attr) if target is not None else None
                if reason is not None:
                    return reason
            if isinstance(inner, ast.Name) and (inner.id in module.defs or inner.id in module.imported):
                reason = self.why(module, inner.id)
                if reason is not None:
                    return reason
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for argument in node.args.args:
                found = self.fixture(module, argument.arg)
                if found is not None and found != (module, getattr(node, "name", "")):
                    reason = self.why(*found)
                    if reason is not None:
                        return reason
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "usefixtures":
                    for argument in decorator.args:
                        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                            found = self.fixture(module, argument.value)
                            reason = self.why(*found) if found is not None else None
                            if reason is not None:
                                return reason
        return None

    def unmarked(self, module: Module) -> list[str]:
        """The tests of ``module`` that start processes without the marker, each with how."""
        if _pytestmark(module.tree.body):
            return []
        found = []
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                tests = [(node, node.decorator_list)]
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                if _marks(node.decorator_list) or _pytestmark(node.body):
                    continue
                tests = [
                    (method, method.decorator_list)
                    for method in node.body
                    if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
                    and method.name.startswith("test")
                ]
            else:
                continue
            for test, decorators in tests:
                reason = None if _marks(decorators) else self.uses(module, test)
                if reason is not None:
                    found.append(f"{module.path.relative_to(self.root.parent)}::{test.name}: {reason}")
        return found


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


@functools.cache
def _processes() -> Processes:
    return Processes()


@pytest.mark.parametrize("path", _test_modules(), ids=lambda p: str(p.relative_to(TESTS)))
def test_tests_that_start_processes_are_marked(path: Path) -> None:
    processes = _processes()
    name = ".".join(["tests", *path.relative_to(TESTS).with_suffix("").parts])
    module = processes.module(name)
    assert module is not None
    assert processes.unmarked(module) == [], f"mark these @pytest.mark.{MARKER} (or the module's pytestmark)"


def test_the_marker_is_registered(pytestconfig: pytest.Config) -> None:
    assert any(line.split(":")[0] == MARKER for line in pytestconfig.getini("markers"))


CHECKED = """
import subprocess
import pytest
from tests.helpers.processes import free_port, spawn

def run():
    return subprocess.run(["true"])

@pytest.fixture
def started():
    return spawn("sim")

def test_direct():
    run()

def test_helper():
    spawn("sim")

def test_fixture(started):
    pass

@pytest.mark.processes
def test_marked():
    run()

def test_port_only():
    free_port()
"""


def test_the_check_follows_helpers_fixtures_and_marks() -> None:
    processes = Processes()
    module = processes.add("tests.fake.test_fake", TESTS / "fake" / "test_fake.py", CHECKED)
    found = [line.split(": ", 1)[0].rsplit("::", 1)[1] for line in processes.unmarked(module)]
    assert found == ["test_direct", "test_helper", "test_fixture"]
    assert "spawn → subprocess" in processes.unmarked(module)[1]
    marked = processes.add(
        "tests.fake.test_marked",
        TESTS / "fake" / "test_marked.py",
        CHECKED + "\npytestmark = pytest.mark.processes\n",
    )
    assert processes.unmarked(marked) == []
