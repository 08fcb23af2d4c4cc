# Sourced by the command tests that need extra devices (tests/cli/*.sh; this folder is not globbed
# as tests). The caller sets $easel.
#
# rpc_setup: a temporary folder $tmp (removed on exit unless KEEP_TMP is set, with every server
#   started below killed), fails=0 for the caller's count.
# start_rpc_server I: one `$easel rpc-server --port 0 --device CPU --threads 1`: the OS hands it a
#   free port, which it holds, and once its own socket listens it writes "HOST:PORT PID" to
#   $tmp/rpcI.port (tests/unit/rpc_servers.h does the same for the unit tests). Waits up to 60 s
#   for that file and checks that the pid in it is the process started here, so a test never
#   talks to a server it did not start; sets rpc_ep[I] (HOST:PORT) and rpc_port[I]. A server that
#   does not come up ends the script with FAIL and status 1: a test without its devices fails.
# start_rpc_pair: rpc_setup, servers 0 and 1, $port0 and $port1, and $rpc, the --rpc-servers
#   flag naming both.
rpc_setup() {
  tmp=$(mktemp -d)
  pids=()
  rpc_ep=()
  rpc_port=()
  trap _rpc_cleanup EXIT
  fails=0
}

start_rpc_server() {
  local i=$1 pf="$tmp/rpc$1.port" log="$tmp/rpc$1.log" p k ep spid
  "$easel" rpc-server --port 0 --port-file "$pf" --device CPU --threads 1 >"$log" 2>&1 &
  p=$!
  pids+=("$p")
  for k in $(seq 600); do
    [ -s "$pf" ] && break
    if ! kill -0 "$p" 2>/dev/null; then
      echo "FAIL rpc-server $i exited before listening: $(tail -n 1 "$log")"
      exit 1
    fi
    sleep 0.1
  done
  if ! [ -s "$pf" ] || ! read -r ep spid <"$pf"; then
    echo "FAIL rpc-server $i did not listen within 60 s: $(tail -n 1 "$log")"
    exit 1
  fi
  if [ "$spid" != "$p" ]; then
    echo "FAIL rpc-server $i: $pf names pid $spid, but this test started pid $p"
    exit 1
  fi
  rpc_ep[$i]=$ep
  rpc_port[$i]=${ep##*:}
}

start_rpc_pair() {
  rpc_setup
  start_rpc_server 0
  start_rpc_server 1
  port0=${rpc_port[0]}
  port1=${rpc_port[1]}
  rpc="--rpc-servers ${rpc_ep[0]},${rpc_ep[1]}"
}

_rpc_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  if [ -n "${KEEP_TMP:-}" ]; then echo "logs kept in $tmp"; else rm -rf "$tmp"; fi
}
