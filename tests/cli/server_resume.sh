#!/bin/bash
# Never lose a job: `easel server` killed with SIGKILL during step k of a job, then started again
# on the same --state-dir: the job resumes from its last checkpoint and ends with the same PNG bytes
# as an uninterrupted run; a job queued behind it is still queued and runs next; finished results
# are still downloadable after a restart. Also SIGTERM during a job: exit 0 within seconds, no
# process left, and the job resumes at the next start. Demo model, 64x64. About 1 min on 2 cores.
# Usage: server_resume.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
tmp=$(mktemp -d)
source "$(dirname "$0")/lib/server.bash"
trap 'kill -9 $server_pid 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
client() { node "$node_tests/client.mjs" "$url" "$@"; }
check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
job='{"type": "txt2img", "prompt": "a large yellow ring on the right, blue background", "steps": 30, "seed": 7, "sampler_name": "Euler a"}'

# the uninterrupted run
start_server 40600 "$tmp/ref" || exit 1
ref=$(client submit "$job")
st=$(client wait "$ref")
check "reference job done" $([ "$st" = done ]; echo $?) "$st"
client image "$ref" 0 "$tmp/ref.png"
stop_server TERM >/dev/null

# SIGKILL during a step, restart, same bytes. The server stops itself (SIGSTOP) right after the
# checkpoint of step 8 is on the disk (EASEL_TEST_STOP_AFTER_STEP, docs/artifacts.md), so the kill
# lands in the middle of the job however fast the steps run (polling the progress raced the job)
EASEL_TEST_STOP_AFTER_STEP=8 start_server 40600 "$tmp/state" || exit 1
ids=$(client submit "$job" '{"prompt": "a small red cross at the bottom, black background", "steps": 2, "seed": 1}')
a=$(echo "$ids" | sed -n 1p)
b=$(echo "$ids" | sed -n 2p)
k=""
for _ in $(seq 1 600); do
  if [ "$(awk '{ print $3 }' "/proc/$server_pid/stat" 2>/dev/null)" = T ]; then k=8; break; fi
  sleep 0.1
done
kill -9 "$server_pid"
wait "$server_pid" 2>/dev/null
sleep 0.2
check "SIGKILL at step $k of 30" $([ -n "$k" ] && [ "$k" -lt 30 ]; echo $?) "step '$k'"
check "no server process left after SIGKILL" $(! kill -0 "$server_pid" 2>/dev/null; echo $?) "pid $server_pid alive"
ls "$tmp/state/jobs/$a/ckpt" > "$tmp/ckpts.txt" 2>/dev/null
check "checkpoints of the killed job are on disk" $([ -s "$tmp/ckpts.txt" ]; echo $?) "none in $tmp/state/jobs/$a/ckpt"
start_server 40600 "$tmp/state" || exit 1
sb=$(client state "$b")
check "the job queued behind it is still queued after the restart" $([[ "$sb" == queued* ]]; echo $?) "$sb"
st=$(client wait "$a")
check "the killed job resumes and finishes" $([ "$st" = done ]; echo $?) "$st"
grep -q "job $a: resuming from its checkpoints" "$tmp/server-$port.log"
check "it resumed from its checkpoint (log)" $? "no resume line in the log"
client image "$a" 0 "$tmp/resumed.png"
cmp -s "$tmp/ref.png" "$tmp/resumed.png"
check "the resumed job's PNG has the uninterrupted run's bytes" $? "$(cmp "$tmp/ref.png" "$tmp/resumed.png" 2>&1)"
st=$(client wait "$b")
check "the queued job then runs" $([ "$st" = done ]; echo $?) "$st"

# SIGTERM during a job: exit 0 within seconds, no process left, the job resumes at the next start
c=$(client submit "$job")
client wait-step "$c" 5 >/dev/null
t0=$(date +%s.%N)
stop_server TERM
rc=$?
t1=$(date +%s.%N)
check "SIGTERM during a job: exit 0" "$rc" "exit $rc"
check "SIGTERM: stopped within 10 s" $(awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 10) }'; echo $?) "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') s"
check "SIGTERM: no process left" $(! kill -0 "$server_pid" 2>/dev/null; echo $?) "pid alive"
grep -q "stopped with the server; it resumes" "$tmp/server-$port.log"
check "SIGTERM: the running job was checkpointed and queued again" $? "$(tail -3 "$tmp/server-$port.log")"

# finished results after a restart; the stopped job finishes with the same bytes too
start_server 40600 "$tmp/state" || exit 1
client image "$a" 0 "$tmp/again.png"
cmp -s "$tmp/ref.png" "$tmp/again.png"
check "a finished result is downloadable after a restart" $? "differs"
st=$(client wait "$c")
client image "$c" 0 "$tmp/c.png"
cmp -s "$tmp/ref.png" "$tmp/c.png"
check "the SIGTERM-stopped job ends with the same bytes" $? "$st"
stop_server TERM >/dev/null

# start-up refusals: one error line, exit 1
err=$("$easel" server -m "$demo_model" -i "$tmp/ref.png" --state-dir "$tmp/x" 2>&1 >/dev/null)
check "a job flag (-i) on the server is refused" $([ $? -eq 1 ] && [[ "$err" == "error: -i is a flag of one job"* ]]; echo $?) "$err"
start_server 40600 "$tmp/state2" || exit 1
err=$("$easel" server -m "$demo_model" --listen-port "$port" --state-dir "$tmp/state3" -t 2 2>&1 >/dev/null | tail -1)
check "a port in use is refused" $([[ "$err" == "error: cannot listen on 127.0.0.1:$port"* ]]; echo $?) "$err"
stop_server TERM >/dev/null
[ "$fails" -eq 0 ] && echo "server_resume: all passed"
exit $((fails > 0))
