"""The network namespace the README's and the docs' commands run in, and a shell in it per test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.readme.shell import CHECKOUT, Namespace

# The ports the README's and the docs' commands use: free on the host when there is no namespace to run in.
DOC_PORTS = (8000, 8001, 8002, 8003, 8080, 8100, 8101, 8102, 8103, 9002, 9003, 9090)


@pytest.fixture(scope="session")
def netns() -> Iterator[str | None]:
    """A network namespace of the session's (root and iproute2's ``ip``), or None, to run on the host's
    loopback, when none can be made and the documents' ports are free there."""
    name = f"slorouter-readme-{os.getpid()}"
    made = (
        shutil.which("ip") is not None
        and os.geteuid() == 0
        and subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False).returncode == 0
    )
    if not made:
        taken = [port for port in DOC_PORTS if _taken(port)]
        if taken:
            pytest.fail(
                f"no network namespace could be made (root and iproute2 needed) and ports {taken} are taken"
            )
        yield None
        return
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def _taken(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def shell(netns: str | None, tmp_path: Path) -> Iterator[Namespace]:
    namespace = Namespace(netns, Path(CHECKOUT), tmp_path)
    try:
        yield namespace
    finally:
        namespace.close()
