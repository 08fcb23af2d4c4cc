#!/usr/bin/env bash
# Fetch ggml 0.25.1 (the copy bundled in llama.cpp release de3ff81, shipped inside the npm
# package node-llama-cpp@3.22.1) into third_party/ggml/. Uses only the npm registry.
# Every hash is verified; any mismatch stops the script with a non-zero exit.
# Usage: scripts/fetch-ggml.sh [--force]
set -euo pipefail

NPM_PKG="node-llama-cpp@3.22.1"
TGZ_SHA256="a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f"
BUNDLE_SHA256="5f5d1105d5df040738d87b8290e5d17e7362131cdcfdb0831618e0ea528b4a51"
GGML_COMMIT="de3ff815ea7d559ee917f063901b8986f038abc6"

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/third_party/ggml"
stamp="$dest/.easel-ggml-commit"

if [ "${1:-}" != "--force" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$GGML_COMMIT" ]; then
  echo "fetch-ggml: third_party/ggml already at $GGML_COMMIT"
  exit 0
fi

die() { echo "fetch-ggml: error: $*" >&2; exit 1; }
command -v npm >/dev/null || die "npm not found (install Debian's npm package, or run scripts/setup.sh)"
command -v git >/dev/null || die "git not found"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

echo "fetch-ggml: npm pack $NPM_PKG"
npm pack --silent "$NPM_PKG" >/dev/null || die "npm pack $NPM_PKG failed (is the npm registry reachable?)"
tgz="$(ls node-llama-cpp-*.tgz 2>/dev/null | head -n1)"
[ -n "$tgz" ] || die "npm pack produced no tarball"
got="$(sha256sum "$tgz" | cut -d' ' -f1)"
[ "$got" = "$TGZ_SHA256" ] || die "tarball sha256 mismatch: expected $TGZ_SHA256, got $got"

tar -xzf "$tgz" package/llama/gitRelease.bundle || die "gitRelease.bundle not found in $tgz"
got="$(sha256sum package/llama/gitRelease.bundle | cut -d' ' -f1)"
[ "$got" = "$BUNDLE_SHA256" ] || die "bundle sha256 mismatch: expected $BUNDLE_SHA256, got $got"

git clone --quiet --bare package/llama/gitRelease.bundle llama.git || die "git clone of the bundle failed"
head="$(git --git-dir=llama.git rev-parse HEAD)"
[ "$head" = "$GGML_COMMIT" ] || die "bundle HEAD mismatch: expected $GGML_COMMIT, got $head"

rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
git --git-dir=llama.git archive HEAD ggml LICENSE | tar -x -C "$dest.tmp"
[ -f "$dest.tmp/ggml/CMakeLists.txt" ] || die "archive lacks ggml/CMakeLists.txt"
echo "$GGML_COMMIT" > "$dest.tmp/.easel-ggml-commit"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "fetch-ggml: ggml $GGML_COMMIT in third_party/ggml"
