"""The network namespace the README's and the docs' commands run in, and a shell in it per test."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.readme.shell import CHECKOUT, Namespace


@pytest.fixture(scope="session")
def netns() -> Iterator[str]:
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.fail("the README walkthrough needs iproute2's `ip` and root, for a network namespace")
    name = f"slorouter-readme-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@pytest.fixture
def shell(netns: str, tmp_path: Path) -> Iterator[Namespace]:
    namespace = Namespace(netns, Path(CHECKOUT), tmp_path)
    try:
        yield namespace
    finally:
        namespace.close()
