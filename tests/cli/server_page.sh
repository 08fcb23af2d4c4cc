#!/bin/bash
# The server's page in headless Chromium (Debian's chromium, puppeteer-core; tests/server/page.mjs):
# submit, progress bar and preview, image and parameters, reuse from the gallery, a mask drawn on
# an uploaded image and in-painting, cancel from the queue, phone width. Screenshots are kept in
# <build dir>/test-artifacts/server-page/. About 1 min on 2 cores.
# Usage: server_page.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
tmp=$(mktemp -d)
source "$(dirname "$0")/lib/server.bash"
trap 'kill -9 $server_pid 2>/dev/null; rm -rf "$tmp"' EXIT
shots="$(cd "$(dirname "$easel")/.." && pwd)/test-artifacts/server-page"
rm -rf "$shots"
mkdir -p "$shots"
if ! command -v chromium >/dev/null; then echo "FAIL chromium is not installed (scripts/setup.sh installs it)"; exit 1; fi
start_server 40400 "$tmp/state" --preview-interval 1 || exit 1
node "$node_tests/page.mjs" "$url" "$shots" "$tmp/profile"
rc=$?
stop_server TERM || { echo "FAIL SIGTERM exit status"; rc=1; }
echo "screenshots: $shots"
exit $rc
