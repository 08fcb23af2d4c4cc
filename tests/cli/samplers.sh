#!/bin/bash
# Samplers, schedulers and their names on the command line (issue 26): A1111 / ComfyUI names pick the
# method and its schedule and are written back in the infotext; --sigmas; --eta 0 is a value; what a
# model cannot run is refused before any stage, on one line. Usage: samplers.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
sd="$data/reference/sd_tiny/sd_tiny.safetensors"
zi="$data/reference/zimage_tiny"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check NAME STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
expect_refused() {  # NAME PATTERN ARGS...: exit 1, one stderr line "error: ...PATTERN...", no stage ran, no out.png
  local name="$1" pattern="$2"
  shift 2
  rm -f "$tmp/out.png"
  err=$(timeout 120 "$easel" "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [[ "$err" != "error: "* ]] || [[ "$err" != *"$pattern"* ]] || [[ "$err" == *"stage "* ]] || [ -e "$tmp/out.png" ]; then
    echo "FAIL $name: exit $rc: $err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $err"
  fi
}
infotext() { tr -c '[:print:]\n' ' ' < "$1" | grep -ao 'Steps: [^V]*'; }
run=(generate -m "$sd" -p cat -n blurry -t 1 -W 64 -H 64 --no-cache)

# names of the one table: the A1111 label brings its schedule and comes back in the infotext
"$easel" "${run[@]}" --steps 3 --sampling-method "DPM++ 2M Karras" -o "$tmp/a.png" >/dev/null 2>&1
check "DPM++ 2M Karras runs" $? ""
infotext "$tmp/a.png" | grep -q "Sampler: DPM++ 2M, Schedule type: Karras"
check "infotext: Sampler: DPM++ 2M, Schedule type: Karras" $? "$(infotext "$tmp/a.png")"
"$easel" "${run[@]}" --steps 3 --sampling-method dpm++2m --scheduler karras -o "$tmp/b.png" >/dev/null 2>&1
cmp -s "$tmp/a.png" "$tmp/b.png"
check "DPM++ 2M Karras = --sampling-method dpm++2m --scheduler karras (same PNG)" $? ""
"$easel" "${run[@]}" --steps 3 --sampling-method k_dpmpp_2m_sde_ka -o "$tmp/c.png" >/dev/null 2>&1
infotext "$tmp/c.png" | grep -q "Sampler: DPM++ 2M SDE, Schedule type: Karras"
check "k_dpmpp_2m_sde_ka: DPM++ 2M SDE with Karras" $? "$(infotext "$tmp/c.png")"
"$easel" "${run[@]}" --steps 3 --sampling-method "Euler a" --scheduler "Align Your Steps" -o "$tmp/d.png" >/dev/null 2>&1
infotext "$tmp/d.png" | grep -q "Sampler: Euler a, Schedule type: Align Your Steps"
check "Euler a + Align Your Steps" $? "$(infotext "$tmp/d.png")"

# --sigmas: steps = count - 1, the schedule as given
out=$("$easel" "${run[@]}" --sigmas "14.61,7.8,3.5,1.2,0" --sampling-method euler -o "$tmp/e.png" 2>&1)
check "--sigmas runs" $? "$out"
printf '%s\n' "$out" | grep -q "4 steps"
check "--sigmas with 5 values runs 4 steps" $? "$out"

# --eta 0 is a value: euler_a with eta 0 is euler's ODE step (no noise): a different image than eta 1
"$easel" "${run[@]}" --steps 3 --sampling-method euler_a --eta 0 -o "$tmp/f0.png" >/dev/null 2>&1
"$easel" "${run[@]}" --steps 3 --sampling-method euler_a -o "$tmp/f1.png" >/dev/null 2>&1
! cmp -s "$tmp/f0.png" "$tmp/f1.png"
check "--eta 0 differs from euler_a's default eta 1" $? ""
err=$("$easel" "${run[@]}" --steps 1 --sampling-method euler --eta 0.5 -o "$tmp/g.png" 2>&1 >/dev/null)
printf '%s\n' "$err" | grep -q "eta 0.5 has no effect on euler"
check "--eta on a deterministic method warns" $? "$err"

# CFG++ at CFG 1 still encodes the negative prompt (it uses the unconditional prediction)
"$easel" "${run[@]}" --steps 2 --sampling-method euler_cfg_pp --cfg-scale 1 -o "$tmp/h.png" >/dev/null 2>&1
check "euler_cfg_pp at --cfg-scale 1 runs" $? ""

# refused up front, one line
expect_refused "unknown sampler" "unknown sampling method 'nope'" "${run[@]}" --sampling-method nope -o "$tmp/out.png"
expect_refused "A1111 sampler easel lacks" "sampler 'DPM fast' is not available in easel" "${run[@]}" --sampling-method "DPM fast" -o "$tmp/out.png"
expect_refused "schedule named twice" "names the karras schedule but --scheduler is exponential" "${run[@]}" --sampling-method "DPM++ 2M Karras" --scheduler exponential -o "$tmp/out.png"
expect_refused "unsupported scheduler" "scheduler 'bong_tangent' is not available in easel" "${run[@]}" --scheduler bong_tangent -o "$tmp/out.png"
expect_refused "--sigmas increasing" "--sigmas value 2 (4) is not below the one before it (3)" "${run[@]}" --sigmas 3,4,0 -o "$tmp/out.png"
expect_refused "--sigmas not a number" "--sigmas: 'x' is not a number" "${run[@]}" --sigmas 3,x,0 -o "$tmp/out.png"
expect_refused "--sigmas one value" "--sigmas needs at least 2 values" "${run[@]}" --sigmas 3 -o "$tmp/out.png"
expect_refused "--eta < 0" "--eta must be a finite number >= 0" "${run[@]}" --eta -1 -o "$tmp/out.png"
expect_refused "tcd --eta > 1" "for tcd (its gamma) must be between 0 and 1" "${run[@]}" --sampling-method tcd --eta 2 -o "$tmp/out.png"
zrun=(generate --diffusion-model "$zi/zimage_tiny_transformer.safetensors" --vae "$zi/zimage_tiny_vae.safetensors"
      --llm "$zi/diffusers/text_encoder/model.safetensors" -p cat -t 1 -W 64 -H 64 --steps 2 --no-cache)
expect_refused "ddim on a flow model" "sampling method ddim has no form for flow models" "${zrun[@]}" --sampling-method ddim -o "$tmp/out.png"
expect_refused "ays on a flow model" "the ays scheduler's noise levels are for SD1.x/SDXL" "${zrun[@]}" --scheduler ays -o "$tmp/out.png"
expect_refused "--sigmas above 1 on a flow model" "is above 1: a flow model's sigmas run from 1 to 0" "${zrun[@]}" --sigmas 2,0.5,0 -o "$tmp/out.png"
"$easel" "${zrun[@]}" --sampling-method uni_pc -o "$tmp/z.png" >/dev/null 2>&1
check "uni_pc on Z-Image runs" $? ""

[ "$fails" -eq 0 ] && echo "all sampler checks passed" || echo "$fails sampler checks failed"
[ "$fails" -eq 0 ]
