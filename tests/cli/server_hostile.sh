#!/bin/bash
# A bounded hostile-request run on loopback (tests/server/hostile.mjs: over 1000 malformed,
# mistyped, oversized, truncated and slow requests, --max-body-mib 2): no 5xx, no crash, the
# server still answers and finishes a real job, and it stops cleanly on SIGTERM afterwards;
# then tests/server/bodies.mjs: bodies over the limit of every content type and framing (413
# naming the limit), a form-encoded JSON body over 8 KiB, empty bodies answered at once, unknown
# <sd_cpp_extra_args> keys refused. About 1 min on 2 cores. Usage: server_hostile.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
tmp=$(mktemp -d)
source "$(dirname "$0")/lib/server.bash"
trap 'kill -9 $server_pid 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
start_server 40800 "$tmp/state" --max-body-mib 2 || exit 1
node "$node_tests/hostile.mjs" "$url" || fails=$((fails + 1))
node "$node_tests/bodies.mjs" "$url" || fails=$((fails + 1))
if kill -0 "$server_pid" 2>/dev/null; then echo "ok   the server is still running"; else echo "FAIL the server died"; fails=$((fails + 1)); fi
stop_server TERM || { echo "FAIL SIGTERM exit status"; fails=$((fails + 1)); }
if grep -qiE "internal error|segmentation|abort" "$tmp"/server-*.log; then echo "FAIL the log shows an internal error"; grep -iE "internal error|segmentation|abort" "$tmp"/server-*.log | head -3; fails=$((fails + 1)); fi
exit $((fails > 0))
