"""Fixtures shared by the HTTP server tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.helpers.http_app import App


@pytest.fixture
async def limited() -> AsyncIterator[list[App]]:
    """Apps with their own limits: ``await _started(limits)`` and append; closed at the end."""
    apps: list[App] = []
    try:
        yield apps
    finally:
        for a in apps:
            a.release.set()
            await a.server.close()
