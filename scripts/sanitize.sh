#!/usr/bin/env bash
# CI's second build: clang with AddressSanitizer + UBSan on easel's code (ggml is not
# instrumented) and libFuzzer's coverage instrumentation, in build-sanitize/ (CMake preset
# "sanitize"); it builds the CLI, the unit tests and the fuzz targets (scripts/fuzz.sh runs them).
# Then runs under the sanitizers (any report fails the test):
#   * every test of easel_tests except the ones EXCLUDE names below (they cost minutes under the
#     sanitizers and exercise code the included tests already cover: see docs/build.md);
#   * the command tests of bad input and faults (label "sanitize" in tests/CMakeLists.txt).
# Usage: scripts/sanitize.sh [ctest arguments...]   (e.g. -R Artifact to run a few)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build=build-sanitize
jobs="$(nproc 2>/dev/null || echo 2)"
# ggml is not instrumented: link the release build's (scripts/setup.sh) instead of compiling it
# again with clang, when that build is there (EASEL_GGML_PREBUILT, cmake/ggml.cmake)
release="${EASEL_BUILD_DIR:-build}"
case "$release" in /*) ;; *) release="$root/$release" ;; esac
prebuilt=""
[ -f "$release/ggml/src/libggml-base.a" ] && prebuilt="-DEASEL_GGML_PREBUILT=$release"
cmake --preset sanitize $prebuilt >/dev/null
cmake --build "$build" -j "$jobs" --target easel_cli easel_tests easel_fuzz
# LeakSanitizer on; a UBSan report ends the process (the build also passes -fno-sanitize-recover)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# the end-to-end parity suites and the multi-device sweeps: minutes each under the sanitizers
EXCLUDE='^(KillResume|Sd2Tiny|SdTinyE2e|SdTinyGguf|ZImageTiny|ZImageTinyGguf|Flux1Tiny|KleinTiny|DemoE2e|DemoChecks)\.|^cli\.(autofit|placement)'
if [ $# -gt 0 ]; then
  ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
else
  # label unit: the tests of easel_tests; label sanitize: the command tests listed in tests/CMakeLists.txt
  ctest --test-dir "$build" --output-on-failure -j "$jobs" -L '^(unit|sanitize)$' -E "$EXCLUDE" --output-junit "$root/$build/ctest-junit.xml"
  python3 scripts/check_skips.py "$root/$build/ctest-junit.xml"
fi
