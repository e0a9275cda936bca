"""Fixtures for the whole suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from slorouter.predictor.state_dir import default_state_dir


def _listing(directory: Path) -> set[tuple[str, int]]:
    if not directory.exists():
        return set()
    return {(str(p), p.stat().st_mtime_ns) for p in [directory, *directory.rglob("*")]}


@pytest.fixture(autouse=True, scope="session")
def state_outside_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Predictor state goes to a temporary XDG_STATE_HOME (inherited by the servers tests start), and the
    suite fails if anything was written to the user's own state directory."""
    user_dir = default_state_dir("serve").parent
    before = _listing(user_dir)
    saved = os.environ.get("XDG_STATE_HOME")
    state_home = tmp_path_factory.mktemp("xdg-state")
    os.environ["XDG_STATE_HOME"] = str(state_home)
    try:
        yield state_home
    finally:
        if saved is None:
            del os.environ["XDG_STATE_HOME"]
        else:
            os.environ["XDG_STATE_HOME"] = saved
    assert _listing(user_dir) == before, f"the tests wrote to the user's state directory {user_dir}"
