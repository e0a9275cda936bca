"""Fixtures for the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slorouter.predictor.state_dir import default_state_dir


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with tests that start processes run first: they hold the longest tests, so that the
    workers of ``make test`` (``--dist loadfile``: a module's tests on one worker, in this order) end on the
    many short modules, and together."""
    starting = {item.path for item in items if item.get_closest_marker("processes") is not None}
    items.sort(key=lambda item: item.path not in starting)


def _listing(directory: Path) -> set[tuple[str, int]]:
    if not directory.exists():
        return set()
    return {(str(p), p.stat().st_mtime_ns) for p in [directory, *directory.rglob("*")]}


@pytest.fixture(autouse=True, scope="session")
def user_state_untouched() -> Iterator[None]:
    """The suite fails if anything was written to the user's own slorouter state directory."""
    user_dir = default_state_dir("serve").parent
    before = _listing(user_dir)
    yield
    assert _listing(user_dir) == before, f"the tests wrote to the user's state directory {user_dir}"


@pytest.fixture(autouse=True)
def state_home(
    user_state_untouched: None, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Each test's predictor state goes to its own temporary XDG_STATE_HOME (servers it starts inherit it)."""
    directory = tmp_path_factory.mktemp("xdg-state")
    monkeypatch.setenv("XDG_STATE_HOME", str(directory))
    return directory
