"""llama.cpp's ``llama-server`` for the benchmarks: where the binary and the model are; one server.

The binary and the model are the real-engine suite's (docs/real-engine.md): ``SLOROUTER_LLAMA_SERVER`` and
``SLOROUTER_LLAMA_MODEL`` when set, else what ``make llama-server gemma-model`` put in ``.cache``. Servers
are started as the suite starts them (tests/realengine/conftest.py): one thread, ``--metrics``, the slots
and context given.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _harness import ROOT, free_port, logged_process

MODEL = "gemma3-270m"  # the name the servers answer to (--alias) and the requests carry
START_TIMEOUT_S = 90.0


def binary() -> str:
    if os.environ.get("SLOROUTER_LLAMA_SERVER"):
        return os.environ["SLOROUTER_LLAMA_SERVER"]
    found = sorted(ROOT.glob(".cache/llama.cpp-*/bin/llama-server"))
    if not found:
        raise SystemExit("no llama-server: run `make llama-server` or set SLOROUTER_LLAMA_SERVER")
    return str(found[-1])


def model_file() -> str:
    path = os.environ.get("SLOROUTER_LLAMA_MODEL") or str(ROOT / ".cache/models/gemma3-270m-q4_k_m.gguf")
    if not Path(path).is_file():
        raise SystemExit(f"no model at {path}: run `make gemma-model` or set SLOROUTER_LLAMA_MODEL")
    return path


@dataclass(frozen=True)
class ServerSpec:
    """One llama-server's serving configuration: slots (--parallel), context (--ctx-size, shared by the
    slots) and threads."""

    parallel: int = 4
    ctx_size: int = 4096
    threads: int = 1

    @property
    def ctx_per_slot(self) -> int:
        return self.ctx_size // self.parallel

    def argv(self, port: int) -> list[str]:
        return [
            binary(), "--model", model_file(), "--alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(self.parallel), "--threads", str(self.threads),
            "--threads-batch", str(self.threads), "--ctx-size", str(self.ctx_size), "--no-webui", "--metrics",
        ]  # fmt: skip

    def describe(self) -> str:
        return f"--parallel {self.parallel} --ctx-size {self.ctx_size} --threads {self.threads}"


def http_json(method: str, url: str, body: Any = None, timeout: float = 120.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read()
    return json.loads(text) if text.strip().startswith((b"{", b"[")) else text.decode()


def metrics(url: str) -> dict[str, float]:
    """The server's ``llamacpp:*`` series (one sample each, no labels)."""
    text = http_json("GET", f"{url}/metrics")
    values: dict[str, float] = {}
    for line in str(text).splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@contextmanager
def llama_server(
    spec: ServerSpec, log_path: Path, port: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A fresh llama-server (nothing cached), healthy; yields (process, base URL)."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    with logged_process(spec.argv(port), [], log_path) as proc:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited:\n{log_path.read_text(errors='replace')[-3000:]}")
            try:
                http_json("GET", f"{url}/health", timeout=2)
                break
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"llama-server on {url} not healthy within {START_TIMEOUT_S:g} s"
                    ) from None
                time.sleep(0.1)
        yield proc, url


# Natural English for prompts: the prose paragraphs of this repository's own documentation at a fixed commit
# (a git object, so the text is the same whatever the working tree holds).
CORPUS_COMMIT = "e136eec"
CORPUS_FILES = ("docs/architecture.md", "docs/simulator.md", "docs/predictor.md", "docs/reliability.md",
                "docs/plugins.md", "docs/configuration.md", "docs/design/README.md")  # fmt: skip


def corpus() -> list[str]:
    """Prose paragraphs (no headings, tables, lists or code), in file order."""
    paragraphs: list[str] = []
    for name in CORPUS_FILES:
        text = subprocess.run(
            ["git", "show", f"{CORPUS_COMMIT}:{name}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        in_code = False
        for block in text.split("\n\n"):
            lines = block.strip().splitlines()
            if not lines:
                continue
            if lines[0].startswith("```"):
                in_code = not (in_code or (block.strip().endswith("```") and len(lines) > 1))
                continue
            if in_code or not lines[0][:1].isalpha():
                continue
            paragraph = " ".join(line.strip() for line in lines)
            if len(paragraph) > 200 and "|" not in paragraph:
                paragraphs.append(paragraph.replace("`", "").replace("**", ""))
    return paragraphs
