#!/bin/bash
# The hires fix's second pass as a stage (docs/hires.md) on the tiny SD pipeline:
#  * --checkpoint-dir: its input (the upscaled latent, or the upscaled image's posterior) and its
#    per-step checkpoints are files in DIR/hires;
#  * a process killed (SIGKILL) right after a checkpoint of the second pass resumes there with
#    --resume (the input read from its file, no step of the first pass run again) and writes the
#    same PNG bytes as an uninterrupted run, for a latent and a pixel (Lanczos) upscaler;
#  * `easel plan --hires` shows the second pass's plan at the larger latent, and --auto-fit plans
#    for it;
#  * -i IMAGE with --hires: an img2img first pass at the image's size, then the hires pass (as sd-cli).
# About 40 s on 2 cores.
# Usage: hires_stage.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
model="$data/reference/sd_tiny/sd_tiny.safetensors"
# first pass: 2 steps (checkpoints 1..2); second pass: the last 4 of 8 steps (its checkpoints 1..4 in DIR/hires)
job=(generate -m "$model" -p "a red circle" -W 64 -H 64 --steps 2 -s 5 -t 1 --no-cache --hires --hires-steps 4
  --hires-denoising-strength 0.5)

check() {  # check NAME STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
# wait_stopped PID: until the process is stopped (state T), or it ended (status 1)
wait_stopped() {
  local st
  while st=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null); do
    [ "$st" = "T" ] && return 0
    sleep 0.02
  done
  return 1
}

for up in Latent Lanczos; do
  ck="$tmp/ck_$up"
  "$easel" "${job[@]}" --hires-upscaler "$up" -o "$tmp/plain_$up.png" >"$tmp/plain.log" 2>&1
  check "$up: uninterrupted run" $? "$(tail -n 2 "$tmp/plain.log")"

  # killed right after the second pass's checkpoint 3 (EASEL_TEST_STOP_AFTER_STEP stops the process
  # there; the first pass has only steps 1..2)
  EASEL_TEST_STOP_AFTER_STEP=3 "$easel" "${job[@]}" --hires-upscaler "$up" --checkpoint-dir "$ck" -o "$tmp/killed_$up.png" \
    >"$tmp/killed.log" 2>&1 &
  pid=$!
  if wait_stopped "$pid"; then
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null
    [ -f "$ck/hires/image1-input.safetensors" ] && [ -f "$ck/hires/image1-step0003.safetensors" ] &&
      [ ! -e "$ck/hires/image1-step0004.safetensors" ] && [ -f "$ck/image1-step0002.safetensors" ] && [ ! -e "$tmp/killed_$up.png" ]
    check "$up: killed after the second pass's step 3: its input and checkpoints 1..3 are files, no PNG" $? "$(ls -R "$ck")"
    "$easel" "${job[@]}" --hires-upscaler "$up" --checkpoint-dir "$ck" --resume -o "$tmp/resumed_$up.png" >"$tmp/resumed.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] && cmp -s "$tmp/plain_$up.png" "$tmp/resumed_$up.png"
    check "$up: --resume in the second pass gives the uninterrupted run's PNG bytes" $? "exit $rc: $(tail -n 3 "$tmp/resumed.log")"
    grep -q "the hires pass's input from .*image1-input.safetensors" "$tmp/resumed.log" &&
      grep -q "resuming from .*hires/image1-step0003.safetensors" "$tmp/resumed.log" &&
      ! grep -q "hires fix: .* upscale of the" "$tmp/resumed.log"
    check "$up: the resumed run read the second pass's input file and step 3, upscaled nothing" $? "$(grep -i "hires\|resum" "$tmp/resumed.log")"
    [ -f "$ck/hires/image1-step0004.safetensors" ]
    check "$up: the resumed run wrote the second pass's last checkpoint" $? "$(ls "$ck/hires")"
  else
    check "$up: stopped after step 3" 1 "it ended before stopping: $(tail -n 2 "$tmp/killed.log")"
  fi
done

# an input file made by another first pass (another seed) is not used: upscaled again
ck="$tmp/ck_Latent"
cp "$ck/hires/image1-input.safetensors" "$tmp/input_s5.safetensors"
rm -rf "$ck"
job7=("${job[@]}")
job7[12]=7  # -s 7
EASEL_TEST_STOP_AFTER_STEP=3 "$easel" "${job7[@]}" --checkpoint-dir "$ck" -o "$tmp/k7.png" >"$tmp/k7.log" 2>&1 &
pid=$!
if wait_stopped "$pid"; then
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  cp "$tmp/input_s5.safetensors" "$ck/hires/image1-input.safetensors"
  rm -f "$ck"/hires/image1-step*.safetensors
  "$easel" "${job7[@]}" --checkpoint-dir "$ck" --resume -o "$tmp/r7.png" >"$tmp/r7.log" 2>&1
  rc=$?
  "$easel" "${job7[@]}" -o "$tmp/p7.png" >/dev/null 2>&1
  [ "$rc" -eq 0 ] && cmp -s "$tmp/p7.png" "$tmp/r7.png" && grep -q "was made from another first pass or upscaler; upscaling again" "$tmp/r7.log"
  check "a second-pass input file of another first pass is not used" $? "exit $rc: $(grep -i "hires\|error" "$tmp/r7.log" | head -5)"
else
  check "seed 7: stopped after step 3" 1 "$(tail -n 2 "$tmp/k7.log")"
fi

# easel plan --hires: the first pass's table, then the second pass's at the 16x16 latent, whose
# predicted peak on the CPU is larger
plan=(plan -m "$model" -p "a red circle" -W 64 -H 64 -t 1 --backend diffusion=cpu --hires)
"$easel" "${plan[@]}" >"$tmp/plan.txt" 2>"$tmp/plan.err"
check "easel plan --hires" $? "$(cat "$tmp/plan.err")"
grep -q "job: 64x64 pixels, latent 4x8x8" "$tmp/plan.txt" && grep -q "hires second pass (Latent): 128x128 pixels, latent 4x16x16" "$tmp/plan.txt"
check "plan names both passes' sizes" $? "$(cat "$tmp/plan.txt")"
# the diffusion row's total MiB (field 8) and the per-device peak (CPU row, field NF-1) of each table
d1=$(awk '/^hires second pass/{exit} /^diffusion /{print $8; exit}' "$tmp/plan.txt")
d2=$(awk 'f && /^diffusion /{print $8; exit} /^hires second pass/{f=1}' "$tmp/plan.txt")
p1=$(awk '/^hires second pass/{exit} /^CPU /{print $(NF-1); exit}' "$tmp/plan.txt")
p2=$(awk 'f && /^CPU /{print $(NF-1); exit} /^hires second pass/{f=1}' "$tmp/plan.txt")
awk -v a="$d1" -v b="$d2" -v c="$p1" -v d="$p2" 'BEGIN { exit !(a > 0 && b > a && c > 0 && d > c) }'
check "the second pass's diffusion total ($d1 -> $d2 MiB) and CPU peak ($p1 -> $p2 MiB) are larger" $? "$(cat "$tmp/plan.txt")"
"$easel" "${plan[@]}" --hires-upscaler Lanczos >"$tmp/plan2.txt" 2>&1
grep -q "hires second pass (Lanczos): 128x128 pixels, latent 4x16x16, the upscaled 128x128 image encoded" "$tmp/plan2.txt"
check "plan of a pixel upscaler names the encode" $? "$(cat "$tmp/plan2.txt")"
"$easel" plan -m "$model" -W 64 -H 64 -t 1 --auto-fit --hires --hires-scale 1.5 >"$tmp/fit.txt" 2>&1
check "easel plan --auto-fit --hires" $? "$(tail -n 3 "$tmp/fit.txt")"
"$easel" plan -m "$model" -W 64 -H 64 -t 1 --auto-fit >"$tmp/fit0.txt" 2>&1
# the auto-fit's predicted peak (its "device  peak MiB" table, the CPU row) with and without --hires
f0=$(awk '/^device +peak MiB/{f=1; next} f && /^CPU /{print $2; exit}' "$tmp/fit0.txt")
f1=$(awk '/^device +peak MiB/{f=1; next} f && /^CPU /{print $2; exit}' "$tmp/fit.txt")
grep -q "planning for the hires second pass at 96x96" "$tmp/fit.txt" && awk -v a="$f0" -v b="$f1" 'BEGIN { exit !(a > 0 && b > a) }'
check "--auto-fit plans for the second pass (96x96): predicted peak $f0 -> $f1 MiB" $? "$(cat "$tmp/fit.txt" "$tmp/fit0.txt")"

# -i IMAGE --hires: img2img at the image's size (64x64), then the second pass at 128x128
"$easel" generate -m "$model" -p "a red circle" -i "$data/reference/sd_tiny/case_init_image.png" --strength 0.6 --steps 2 -s 5 -t 1 \
  --no-cache --hires -o "$tmp/i.png" >"$tmp/i.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q "hires fix: 64x64 -> 128x128" "$tmp/i.log" && grep -aq "Size: 64x64, .*Hires upscale: 2" "$tmp/i.png"
check "-i with --hires: img2img first pass, then the hires pass" $? "exit $rc: $(tail -n 3 "$tmp/i.log")"

echo "$fails failures"
[ "$fails" -eq 0 ]
