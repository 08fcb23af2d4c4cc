#!/usr/bin/env bash
# Runs every test: sets up and builds (idempotent, see scripts/setup.sh), then ctest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
build="${EASEL_BUILD_DIR:-build}"
ctest --test-dir "$build" --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
