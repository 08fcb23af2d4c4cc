#!/bin/bash
# `easel server` with --upscale-model and --hires-upscalers-dir on the demo model (64x64, 2
# steps): A1111's enable_hr / hr_* and sd-server's hires object do the hires fix, the upscaler
# lists name the real upscalers (tests/server/hires.mjs); the per-job --hires flags are refused at
# the server's start. About 1 min on 2 cores.
# Usage: server_hires.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
tmp=$(mktemp -d)
source "$(dirname "$0")/lib/server.bash"
trap 'kill -9 $server_pid 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
err=$("$easel" server -m "$demo_model" --hires --state-dir "$tmp/s0" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -ne 1 ] || [[ "$err" != "error: --hires is a flag of one job, not of the server"* ]]; then
  echo "FAIL server --hires: exit $rc: $err"; fails=$((fails + 1))
else
  echo "ok   server --hires refused: $err"
fi
start_server 41400 "$tmp/state" --upscale-model "$data/esrgan/srvgg_x2_tiny.safetensors" --hires-upscalers-dir "$data/esrgan" || exit 1
node "$node_tests/hires.mjs" "$url" || fails=$((fails + 1))
stop_server TERM
rc=$?
if [ "$rc" -ne 0 ]; then echo "FAIL SIGTERM: exit $rc"; fails=$((fails + 1)); fi
if grep -q "internal error" "$tmp"/server-*.log; then echo "FAIL the server logged an internal error"; grep "internal error" "$tmp"/server-*.log | head -3; fails=$((fails + 1)); fi
[ "$fails" -eq 0 ] && echo "server_hires: all passed" || echo "server_hires: $fails check(s) failed"
exit $((fails > 0))
