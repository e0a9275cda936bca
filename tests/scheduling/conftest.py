"""Fixtures for scheduling tests; the builders they share are in tests/helpers/scheduling.py."""

from __future__ import annotations

import pytest

from slorouter.scheduling.plugin import PluginContext
from tests.helpers.scheduling import make_ctx


@pytest.fixture
def ctx() -> PluginContext:
    return make_ctx()
