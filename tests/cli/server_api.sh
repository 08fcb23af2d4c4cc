#!/bin/bash
# `easel server` on the demo model (64x64, 2 steps): AUTOMATIC1111 requests as A1111's API
# documents them (tests/server/a1111.mjs: discovery, txt2img, progress polling with a preview,
# interrupt, img2img with a mask, errors) and easel's jobs API with sd.cpp's /sdcpp/v1 names
# (tests/server/jobs.mjs: events, results by id, cancel, queue bound). About 1 min on 2 cores.
# Usage: server_api.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
tmp=$(mktemp -d)
source "$(dirname "$0")/lib/server.bash"
trap 'kill -9 $server_pid 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
start_server 40000 "$tmp/state" --max-queue 2 || exit 1
node "$node_tests/a1111.mjs" "$url" || fails=$((fails + 1))
node "$node_tests/jobs.mjs" "$url" || fails=$((fails + 1))
stop_server TERM
rc=$?
if [ "$rc" -ne 0 ]; then echo "FAIL SIGTERM: exit $rc"; fails=$((fails + 1)); fi
if grep -q "internal error" "$tmp"/server-*.log; then echo "FAIL the server logged an internal error"; grep "internal error" "$tmp"/server-*.log | head -3; fails=$((fails + 1)); fi
[ "$fails" -eq 0 ] && echo "server_api: all passed" || echo "server_api: $fails script(s) failed"
exit $((fails > 0))
