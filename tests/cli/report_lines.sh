#!/bin/bash
# What `easel generate` reports about a run (tryout report F17, F18, F21,
# /work/notes/tryout_report.md): the decode stage line of the plain (unplaced) CPU path gives the
# VAE's compute buffer (it said 0.0 MiB), equal to `easel plan`'s prediction for the same graph;
# the closing memory line names every device that ran a module, an rpc-server included (it left
# out the device of a placed diffusion model, freed before the line was made); the model line
# says "UNet" once; `generate --help`'s demo example is the README's first command: no sampler or CFG flag
# (the model file's recommended settings, issue 28).
# Usage: report_lines.sh EASEL_BINARY TEST_DATA_DIR. One rpc-server (lib/rpc.bash).
set -u
easel="$1"
data="$2"
sd="$data/reference/sd_tiny/sd_tiny.safetensors"
source "$(dirname "$0")/lib/rpc.bash"
rpc_setup  # $tmp (removed on exit, servers killed), fails=0
check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}

# F17: plain CPU run at 128x128: the decode stage's VAE compute = plan's vae compute (MiB, 0.1)
"$easel" generate -m "$sd" -p x -t 1 --steps 1 -W 128 -H 128 --no-cache -o "$tmp/a.png" >/dev/null 2>"$tmp/gen.txt"
rc=$?
got=$(sed -n 's/^stage decode: .*vae parameters [0-9.]* MiB, compute \([0-9.]*\) MiB.*/\1/p' "$tmp/gen.txt")
# plan's table: module device blocks params slots compute ... (MiB)
want=$("$easel" plan -m "$sd" -p x -W 128 -H 128 --backend CPU 2>/dev/null | awk '$1 == "vae" && $2 == "CPU"' | head -n1)
plan_compute=$(printf '%s\n' "$want" | awk '{print $6}')
awk -v g="$got" -v w="$plan_compute" 'BEGIN { exit !(g != "" && w != "" && g > 0 && (g - w < 0.15 && w - g < 0.15)) }'
check "decode stage line: vae compute ${got:-?} MiB = plan's ${plan_compute:-?} MiB (was 0.0)" $? "exit $rc; $(grep 'stage decode' "$tmp/gen.txt"); plan row: $want"
grep -q "^memory on CPU: .*largest compute buffer" "$tmp/gen.txt"
check "closing line of the plain path" $? "$(tail -n 3 "$tmp/gen.txt")"

# F18: "UNet" once in the model line; the help's demo example as the README's first command
! grep -q "UNet UNet" "$tmp/gen.txt" && grep -q "^model: SD1.x (.*), UNet LDM layout" "$tmp/gen.txt"
check "model line says UNet once" $? "$(grep '^model:' "$tmp/gen.txt")"
line=$("$easel" generate --help | grep "easel-demo-shapes.safetensors")
[[ "$line" == *'-p "a large red circle in the centre, blue background"'* ]] && [[ "$line" != *--cfg-scale* ]] && [[ "$line" != *--sampling-method* ]]
check "generate --help demo example: the README's prompt, no sampler or CFG flag (the file's settings)" $? "$line"

# F21: diffusion placed on an rpc-server: the closing line names RPC0 beside the CPU
start_rpc_server 0  # rpc_ep[0]; a server that does not come up fails the script
"$easel" generate -m "$sd" -p x -t 1 --steps 2 -W 64 -H 64 --no-cache --rpc-servers "${rpc_ep[0]}" --backend "diffusion=RPC0" \
  -o "$tmp/rpc.png" >/dev/null 2>"$tmp/rpc_gen.txt"
rc=$?
line=$(grep "^memory: " "$tmp/rpc_gen.txt")
[ "$rc" -eq 0 ] && [[ "$line" == *"measured peak per device: "*"RPC0"* ]] && [[ "$line" == *"CPU "* ]]
check "closing line names RPC0 (diffusion) and CPU (te, vae)" $? "exit $rc: $line $(tail -n 2 "$tmp/rpc_gen.txt")"

[ "$fails" -eq 0 ] && echo "all report line checks passed" || echo "$fails report line checks failed"
[ "$fails" -eq 0 ]
