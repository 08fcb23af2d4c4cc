#!/usr/bin/env bash
# Runs every test: sets up and builds (idempotent, see scripts/setup.sh), the Windows cross-build
# and its smoke test under Wine (scripts/test-windows.sh; EASEL_SKIP_WINDOWS=1 leaves it out),
# then ctest (last, so that its summary closes the output).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
build="${EASEL_BUILD_DIR:-build}"
if [ "${EASEL_SKIP_WINDOWS:-0}" != "1" ]; then
  EASEL_LINUX_EASEL="$build/bin/easel" scripts/test-windows.sh
fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
