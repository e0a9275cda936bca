"""Running a document's commands as written: read from its fenced blocks, run with ``bash -c`` in a network
namespace of their own (only a loopback, so the ports the document names are free and are the ones used),
in the README checkout (``make test-readme``) with its ``.venv/bin`` first on ``PATH``, as an activated
environment would have it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.doc_commands import SHELL_BLOCKS, fenced_blocks, logical_lines

CHECKOUT = os.environ.get("SLOROUTER_README_CHECKOUT", "")


@dataclass
class DocCommands:
    """A document's command lines: each as ``tests/helpers/doc_commands.py`` reads it (continuations joined,
    spaces collapsed), to find it by how it begins, and as the document writes it (its lines), to run."""

    lines: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> DocCommands:
        commands = cls()
        for info, start, block in fenced_blocks(path.read_text(encoding="utf-8")):
            if info not in SHELL_BLOCKS:
                continue
            found = list(logical_lines(start, block))
            ends = [first for first, _, _ in found[1:]] + [start + len(block)]
            for (first, text, _), end in zip(found, ends, strict=True):
                commands.lines.append(text)
                commands.written.append("\n".join(block[first - start : end - start]).strip())
        return commands

    def line(self, beginning: str) -> str:
        """The command line that begins ``beginning`` (there must be one), as the document writes it."""
        found = [i for i, line in enumerate(self.lines) if line.startswith(beginning)]
        assert len(found) == 1, f"{len(found)} command lines begin {beginning!r}, not one"
        return self.written[found[0]]


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


class Namespace:
    """A network namespace with only a loopback (None: the host's), where the commands run in ``cwd``."""

    def __init__(self, name: str | None, cwd: Path, logs: Path) -> None:
        self.name, self.cwd, self.logs = name, cwd, logs
        self.started: list[Started] = []

    def _argv(self, command: str) -> list[str]:
        inside = [] if self.name is None else ["ip", "netns", "exec", self.name]
        return [*inside, "bash", "-c", command]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.cwd / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"}

    def run(self, command: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._argv(command),
            cwd=self.cwd,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def start(self, command: str) -> Started:
        """``command`` in the background, in a process group of its own (as a terminal runs it)."""
        index = len(self.started)
        out, err = self.logs / f"{index}.out", self.logs / f"{index}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                self._argv(command),
                cwd=self.cwd,
                env=self._env(),
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        started = Started(process, out, err)
        self.started.append(started)
        return started

    def wait_until_answers(self, url: str, started: Started, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if started.process.poll() is not None:
                raise AssertionError(f"exited with {started.process.returncode}: {started.output()[-3000:]}")
            if self.run(f"curl -sf -o /dev/null {url}", timeout_s=10).returncode == 0:
                return
            time.sleep(0.3)
        raise AssertionError(f"{url} did not answer in {timeout_s} s: {started.output()[-3000:]}")

    def wait_for_output(self, started: Started, marker: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while marker not in started.output():
            if started.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {marker!r} in the output: {started.output()[-3000:]}")
            time.sleep(0.2)

    def interrupt(self, started: Started, timeout_s: float = 30) -> str:
        """Ctrl-C: SIGINT to the command's process group; its output once it exited."""
        os.killpg(started.process.pid, signal.SIGINT)
        try:
            started.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(started.process.pid, signal.SIGKILL)
            started.process.wait()
            raise AssertionError(
                f"still running {timeout_s} s after Ctrl-C: {started.output()[-3000:]}"
            ) from None
        output = started.output()
        assert "Traceback" not in output, output[-3000:]
        return output

    def close(self) -> None:
        for started in self.started:
            if started.process.poll() is None:
                os.killpg(started.process.pid, signal.SIGKILL)
                started.process.wait()
