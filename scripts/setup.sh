#!/usr/bin/env bash
# One-time (and idempotent) set-up on Debian: installs the packages the build needs,
# fetches the pinned ggml, configures and builds easel into build/.
# Options (environment): EASEL_BUILD_DIR (default build), EASEL_CMAKE_ARGS (extra cmake flags),
#                        EASEL_SKIP_APT=1 (do not touch packages).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

# Libraries: checked with dpkg. Tools: checked by command, since they may come from elsewhere
# (a Node.js install brings its own npm, which conflicts with Debian's npm package).
PACKAGES=(build-essential pkg-config
  libstb-dev libpng-dev zlib1g-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libspdlog-dev libfmt-dev
  libxxhash-dev libssl-dev libsqlite3-dev libsentencepiece-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-dev  # clang + its sanitizer/libFuzzer runtimes: CI's sanitizer build (scripts/sanitize.sh)
  chromium)  # chromium: the server page's test in headless Chromium (tests/cli/server_page.sh)
declare -A TOOLS=([cmake]=cmake [git]=git [npm]=npm [python3]=python3)

if [ "${EASEL_SKIP_APT:-0}" != "1" ]; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  for t in "${!TOOLS[@]}"; do
    command -v "$t" >/dev/null 2>&1 || missing+=("${TOOLS[$t]}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

scripts/fetch-ggml.sh

# npm packages of the server's client tests (tests/server: the openai SDK, puppeteer-core), from
# the lock file; again only when the lock file changed.
if [ -f tests/server/package-lock.json ] && command -v npm >/dev/null 2>&1; then
  if [ ! -f tests/server/node_modules/.package-lock.json ] || [ tests/server/package-lock.json -nt tests/server/node_modules/.package-lock.json ]; then
    echo "setup: installing the server tests' npm packages (tests/server)"
    npm ci --prefix tests/server --no-audit --no-fund --loglevel=error
  fi
fi

build="${EASEL_BUILD_DIR:-build}"
jobs="$(nproc 2>/dev/null || echo 2)"
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${EASEL_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs"
echo "setup: built $build/bin/easel"
