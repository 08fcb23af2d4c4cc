#!/bin/bash
# Faults survived, with the tiny SD pipeline and `easel rpc-server`s on 127.0.0.1:
#  * a server survives any client dying: connections that send HELLO and close without reading
#    the answer (the server's reply then hits a closed socket: SIGPIPE ended the server, exit 141,
#    before it ignored the signal), and `easel generate` runs with the UNet on the server killed
#    with SIGKILL right after a checkpoint and during steps; afterwards the server still runs and a
#    run on it gives the same PNG as the plain CPU run;
#  * a client survives its server dying: the server is killed while the client is stopped after
#    the checkpoint of step 1 (EASEL_TEST_STOP_AFTER_STEP, docs/artifacts.md), the client goes
#    on: one "error:" line naming the rpc-server, exit 1, nothing in its output folder;
#  * `easel rpc-server` on a port that is taken: one error line, exit 1 (it exited 0).
# Usage: faults.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
model="$data/reference/sd_tiny/sd_tiny.safetensors"
source "$(dirname "$0")/lib/rpc.bash"
rpc_setup  # $tmp, fails=0
start_rpc_server 0
ep="${rpc_ep[0]}"
port="${rpc_port[0]}"
server="${pids[0]}"
job=(-m "$model" -p "a cat" -W 64 -H 64 --steps 6 -s 3 -t 1 --no-cache)
check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
alive() { kill -0 "$server" 2>/dev/null; }

"$easel" generate "${job[@]}" -o "$tmp/plain.png" >/dev/null 2>"$tmp/plain.log" || { echo "FAIL plain run: $(tail -1 "$tmp/plain.log")"; exit 1; }

# wait_stopped PID: until the process is stopped (state T), or it ended (status 1)
wait_stopped() {
  local st
  while st=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null); do
    [ "$st" = "T" ] && return 0
    sleep 0.02
  done
  return 1
}

# 1a. HELLO, then close without reading the reply (ggml RPC: command 14, size 24, 24 caps bytes)
hello='\x0e\x18\x00\x00\x00\x00\x00\x00\x00'
for i in $(seq 24); do hello+='\x00'; done
for i in $(seq 30); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf "$hello" >&3 && exec 3>&-) 2>/dev/null
done
sleep 0.5
alive
check "the server survives 30 clients that close without reading its reply" $? "exit status $(wait "$server"; echo $?): $(tail -n 2 "$tmp/rpc0.log")"

# 1b. clients killed with SIGKILL mid-run: right after the checkpoint of step 2, then during steps
# (at a checkpoint, then 0.1 s, 0.3 s and 0.6 s after it: each a valid moment to die at)
for delay in 0 0.1 0.3 0.6; do
  rm -rf "$tmp/ck"
  EASEL_TEST_STOP_AFTER_STEP=2 "$easel" generate "${job[@]}" --rpc-servers "$ep" --backend diffusion=RPC0 --checkpoint-dir "$tmp/ck" \
    -o "$tmp/killed.png" >"$tmp/killed.log" 2>&1 &
  client=$!
  if ! wait_stopped "$client"; then
    check "client killed $delay s after step 2" 1 "it ended before stopping: $(tail -n 2 "$tmp/killed.log")"
    continue
  fi
  if [ "$delay" != 0 ]; then
    kill -CONT "$client"
    sleep "$delay"
  fi
  kill -KILL "$client" 2>/dev/null
  wait "$client" 2>/dev/null
  sleep 0.2
  alive
  check "the server survives a client killed $delay s after step 2" $? "exit status $(wait "$server"; echo $?): $(tail -n 2 "$tmp/rpc0.log")"
done
rm -f "$tmp/killed.png"

# ... and serves the next run: the same PNG as the plain CPU run (the server runs the CPU backend)
"$easel" generate "${job[@]}" --rpc-servers "$ep" --backend diffusion=RPC0 -o "$tmp/after.png" >"$tmp/after.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && cmp -s "$tmp/plain.png" "$tmp/after.png"
check "a run on the same server afterwards gives the plain run's PNG" $? "exit $rc: $(grep -m1 error "$tmp/after.log")"

# 2. the server dies while the client is between steps: one error line, exit 1, nothing written
mkdir -p "$tmp/out"
rm -rf "$tmp/ck"
EASEL_TEST_STOP_AFTER_STEP=1 "$easel" generate "${job[@]}" --rpc-servers "$ep" --backend diffusion=RPC0 --checkpoint-dir "$tmp/ck" \
  -o "$tmp/out/orphan.png" >/dev/null 2>"$tmp/orphan.err" &
client=$!
if wait_stopped "$client"; then
  kill -KILL "$server"
  wait "$server" 2>/dev/null
  kill -CONT "$client"
  wait "$client"
  rc=$?
  # (the lines before it are the run's progress: stage lines)
  err=$(grep "^error: " "$tmp/orphan.err")
  lines=$(printf '%s\n' "$err" | grep -c .)
  [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && [ "$(tail -n 1 "$tmp/orphan.err")" = "$err" ] && [[ "$err" == *"rpc-server"* ]] &&
    [ -z "$(ls -A "$tmp/out")" ]
  check "the client of a server that died: one error line, exit 1, nothing written" $? \
    "exit $rc, $lines error lines: $err; last line: $(tail -n 1 "$tmp/orphan.err"); output folder: $(ls -A "$tmp/out")"
else
  check "the client of a server that died" 1 "it ended before stopping: $(tail -n 2 "$tmp/orphan.err")"
fi

# 3. a port that is taken: one error line, exit 1
start_rpc_server 1
err=$("$easel" rpc-server --port "${rpc_port[1]}" --device CPU --threads 1 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$err" | grep -c '^error: ')" -eq 1 ] && [[ "$err" == *"cannot listen on 127.0.0.1:${rpc_port[1]}"* ]]
check "rpc-server on a taken port: one error line, exit 1" $? "exit $rc: $err"

[ "$fails" -eq 0 ] && echo "all fault checks passed" || echo "$fails fault checks failed"
[ "$fails" -eq 0 ]
