# Sourced by the server tests (tests/cli/server_*.sh; this folder is not globbed as tests).
# Needs $easel (the binary) and $tmp (a temporary folder the caller removes).
#
# start_server BASE STATE [FLAGS...]: `$easel server` on the bundled demo model, 64x64 and 2 steps
# by default (the tests check plumbing), listening on 127.0.0.1:$port with $port = BASE + PID %
# 200 (another port of the range when taken), its state in STATE, its log in $tmp/server-$port.log;
# waits up to 120 s until GET /easel/v1/info answers. Sets $port, $url, $server_pid; returns 1
# (with the log's tail) when it does not come up. Each script takes its own BASE, 200 ports
# apart: 40000 server_api, 40200 server_openai, 40400 server_page, 40600 server_resume,
# 40800 server_hostile, 41000 server_signals, 41200 bench/server_bench.sh, 41400 server_hires.
# stop_server [SIGNAL]: sends SIGNAL (TERM) and waits up to 60 s; returns the exit status.
# node_tests: the folder of the client scripts and their node_modules (tests/server).
node_tests="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../server" && pwd)"
demo_model="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/models/demo/easel-demo-shapes.safetensors"

start_server() {
  local base="$1" state="$2" attempt i
  shift 2
  for attempt in 0 1 2 3 4 5; do
    port=$((base + ($$ + attempt * 37) % 200))
    url="http://127.0.0.1:$port"
    "$easel" server -m "$demo_model" --listen-port "$port" --state-dir "$state" -W 64 -H 64 --steps 2 \
      --sampling-method euler --cfg-scale 5 -t 2 --cache-dir "$tmp/cache" "$@" >"$tmp/server-$port.log" 2>&1 &
    server_pid=$!
    for i in $(seq 1200); do
      if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
      if grep -q "easel server: http://" "$tmp/server-$port.log" 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
        return 0
      fi
      sleep 0.1
    done
    if kill -0 "$server_pid" 2>/dev/null; then break; fi  # up but not answering: a real failure
    grep -q "cannot listen" "$tmp/server-$port.log" || break  # it failed for another reason than the port
  done
  echo "FAIL the server did not come up; its log:"
  tail -20 "$tmp/server-$port.log"
  return 1
}

stop_server() {
  local sig="${1:-TERM}" i
  kill -s "$sig" "$server_pid" 2>/dev/null
  for i in $(seq 600); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$server_pid" 2>/dev/null; then
    echo "FAIL the server did not exit within 60 s of SIG$sig"
    kill -9 "$server_pid" 2>/dev/null
  fi
  wait "$server_pid"
}
