# Sourced by the placement CLI tests (tests/cli/*.sh; this folder is not globbed as tests).
# start_rpc_pair BASE [SLOTS]: a temporary folder $tmp (removed on exit unless KEEP_TMP is set), two
# `$easel rpc-server --device CPU --threads 1` on 127.0.0.1 ports $port0 = BASE + 2 * (PID % SLOTS)
# (SLOTS: pairs in the script's range, default 400)
# and $port1 = $port0 + 1 (another pair of the range when a port is taken; killed on exit),
# waited for up to 30 s, and $rpc, the --rpc-servers
# flag naming both; fails=0 for the caller's count. Each script takes its own BASE, 800 ports
# apart from the others': 52000 placement, 59000 autofit, 60000 placement_zimage, 60800
# placement_flux, 61000 placement_vae, 62000 autofit_sweep; smaller ranges: 50000 placement_taesd
# (50 pairs), 50200 autofit_encode (20 pairs), 65500 placement_vae_encode (17 pairs, ports end at 65535) (and the unit tests',
# tests/unit/rpc_servers.h).
start_rpc_pair() {
  tmp=$(mktemp -d)
  pids=()
  trap _rpc_pair_cleanup EXIT
  fails=0
  local attempt port i up p0 p1 slots=${2:-400}
  # a port can be taken (another test, or an outgoing connection's ephemeral port: the range
  # overlaps Linux's 32768-60999): a server that exits at once is started on another pair
  for attempt in 0 1 2 3 4 5 6 7; do
    port0=$(($1 + (($$ + attempt * 53) % slots) * 2))
    port1=$((port0 + 1))
    "$easel" rpc-server --port "$port0" --device CPU --threads 1 >"$tmp/rpc-$port0.log" 2>&1 &
    p0=$!
    "$easel" rpc-server --port "$port1" --device CPU --threads 1 >"$tmp/rpc-$port1.log" 2>&1 &
    p1=$!
    up=0
    for i in $(seq 300); do
      if (exec 3<>/dev/tcp/127.0.0.1/$port0) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/$port1) 2>/dev/null; then up=1; break; fi
      kill -0 "$p0" 2>/dev/null && kill -0 "$p1" 2>/dev/null || break  # one exited: its port is taken
      sleep 0.1
    done
    if [ "$up" = 1 ]; then
      pids+=("$p0" "$p1")
      break
    fi
    kill "$p0" "$p1" 2>/dev/null
    wait "$p0" "$p1" 2>/dev/null
  done
  rpc="--rpc-servers 127.0.0.1:$port0,127.0.0.1:$port1"
}

_rpc_pair_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  if [ -n "${KEEP_TMP:-}" ]; then echo "logs kept in $tmp"; else rm -rf "$tmp"; fi
}
