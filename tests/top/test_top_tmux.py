"""``slorouter top`` in a real terminal: tmux runs it in a pane, the test reads the pane as a user sees it.

It draws the router and its endpoints, redraws every second, shows an unreachable router as one line and
keeps retrying, and quits cleanly on Ctrl-C. tmux comes from Debian's package (``make test`` installs it
when it can); without it the test is skipped, saying so.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.top.conftest import CLI, WatchedRouter, complete

TMUX = shutil.which("tmux")
pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(
        TMUX is None, reason="tmux is not installed (apt-get install tmux; make test installs it as root)"
    ),
]
WIDTH, HEIGHT = 132, 30


class Tmux:
    """A tmux server of the test's own (its own socket, no user configuration)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket = f"slorouter-top-test-{os.getpid()}"
        # The panes' environment is the server's, taken from the process that starts it: without COLUMNS and
        # LINES (set under pytest), so that programs in a pane see the pane's size.
        self.env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    def __call__(self, *args: str) -> str:
        assert TMUX is not None
        result = subprocess.run(
            [TMUX, "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=10,
            env=self.env,
        )
        assert result.returncode == 0, f"tmux {' '.join(args)}: {result.stderr}"
        return result.stdout

    def start(self, target: str, *command: str) -> None:
        """Run ``command`` in a new window named ``target``, in a WIDTH x HEIGHT terminal. A launcher that
        ignores Ctrl-C runs it and writes its exit status (or the signal that ended it) to a file."""
        launcher = (
            "import signal, subprocess, sys\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "default = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
            "code = subprocess.call(sys.argv[2:], preexec_fn=default)\n"
            "open(sys.argv[1], 'w').write(str(code) if code >= 0 else f'signal {-code}')\n"
            "signal.pause()\n"
        )
        line = shlex.join([sys.executable, "-c", launcher, str(self._status_file(target)), *command])
        if not self._has_session():
            self("new-session", "-d", "-s", "t", "-n", target, "-x", str(WIDTH), "-y", str(HEIGHT), line)
        else:
            self("new-window", "-d", "-t", "t", "-n", target, line)

    def _status_file(self, target: str) -> Path:
        return self.directory / f"{target}.status"

    def screen(self, target: str) -> str:
        screen = self("capture-pane", "-p", "-J", "-t", f"t:{target}")  # -J: wrapped lines joined
        return "\n".join(line.rstrip() for line in screen.splitlines())

    def wait_for(self, target: str, check: Callable[[str], bool], timeout_s: float = 20.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen(target)
            if check(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"the pane never showed what was expected; it shows:\n{screen}")
            time.sleep(0.1)

    def exit_status(self, target: str, timeout_s: float = 10.0) -> str:
        """The exit status of the pane's command once it has ended (``signal N`` if a signal ended it)."""
        deadline = time.monotonic() + timeout_s
        path = self._status_file(target)
        while not path.exists() or not path.read_text():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the command in pane {target} did not end; it shows:\n{self.screen(target)}"
                )
            time.sleep(0.1)
        return path.read_text()

    def _has_session(self) -> bool:
        assert TMUX is not None
        check = [TMUX, "-L", self.socket, "has-session", "-t", "t"]
        return subprocess.run(check, capture_output=True, timeout=10).returncode == 0

    def kill(self) -> None:
        assert TMUX is not None
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    server = Tmux(tmp_path)
    try:
        yield server
    finally:
        server.kill()


CLOCK = re.compile(r"· (\d\d:\d\d:\d\d)$", re.MULTILINE)


def test_top_draws_the_router_redraws_every_second_and_quits_on_ctrl_c(
    tmux: Tmux, watched_router: WatchedRouter
):
    tmux.start("top", *CLI, "top", watched_router.address)
    screen = tmux.wait_for(
        "top", lambda s: all(pod in s for pod in watched_router.pods) and "predictor embedded, ready" in s
    )
    lines = screen.splitlines()
    assert lines[0].startswith(f"slorouter top · gateway http://{watched_router.address} · up ")
    assert any(line.startswith("SLO attainment 100.0%") for line in lines)
    assert any(line.startswith("routes predicted ") for line in lines)
    header = next(line for line in lines if "endpoint" in line)
    columns = r"in-flight .* queue .* running .* KV .* TTFT pred .* TTFT obs .* TTFT cov .* picks"
    assert re.search(columns, header)
    for pod in watched_router.pods:
        row = next(line for line in lines if pod in line)
        assert row.count("%") in (2, 3)  # KV, the share of picks, the TTFT coverage once it has outcomes
    # Redrawn every second: the clock in the first line moves on.
    first = CLOCK.search(lines[0])
    assert first is not None
    tmux.wait_for("top", lambda s: (m := CLOCK.search(s.splitlines()[0])) is not None and m[1] != first[1])
    # A request through the gateway shows in the next frames' rate.
    complete(watched_router.address, "one more")
    tmux.wait_for("top", lambda s: re.search(r"^requests [\d,]+ \([\d.]+/s\)", s, re.MULTILINE) is not None)

    tmux("send-keys", "-t", "t:top", "C-c")
    assert tmux.exit_status("top") == "0"
    assert "Traceback" not in tmux.screen("top")


def test_an_unreachable_router_is_one_line_retried_until_it_answers(tmux: Tmux):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tmux.start("down", *CLI, "top", f"127.0.0.1:{port}")
    screen = tmux.wait_for("down", lambda s: "retrying every 1 s" in s)
    lines = [line for line in screen.splitlines() if line.strip()]
    assert (
        lines[1]
        == f"cannot reach http://127.0.0.1:{port}: connection refused (is it running? is this its port?)"
    )
    assert "Traceback" not in screen
    # The router comes up on that port: the next retry draws it.
    serve = subprocess.Popen(
        [*CLI, "serve", "--port", str(port), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def healthy_pods(screen: str) -> int:
            return sum("127.0.0.1:" in line and "●" in line for line in screen.splitlines())

        # Its 4 pods, each drawn healthy once its first scrape is in (a later redraw on a loaded machine).
        screen = tmux.wait_for(
            "down", lambda s: "predictor embedded" in s and healthy_pods(s) == 4, timeout_s=60
        )
        assert f"slorouter top · gateway http://127.0.0.1:{port}" in screen
        assert "cannot reach" not in screen
    finally:
        serve.terminate()
        serve.communicate(timeout=20)
    tmux.wait_for("down", lambda s: "cannot reach" in s)  # gone again: said so, still retrying
    tmux("send-keys", "-t", "t:down", "C-c")
    assert tmux.exit_status("down") == "0"
