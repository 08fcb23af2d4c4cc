#!/bin/bash
# Every option of `easel generate --help` either acts or says why not (issue 20: no sd-cli flag is
# accepted and silently ignored). The script walks the options the help lists; each must be in the
# table below, in one of these classes (an option missing from the table fails: a new flag must be
# classified):
#   warn FAMILY REGEX ARGS  a job on FAMILY with ARGS prints exactly one warning line matching REGEX
#                           and still writes its image;
#   error FAMILY REGEX ARGS a job on FAMILY with ARGS exits 1 with one "error:" line matching REGEX
#                           and writes nothing;
#   act here                its effect is checked below in this script (a named check);
#   act FILE                its effect is checked by that test (FILE under tests/ must name the flag).
# Families: the tiny models of tests/data/reference (sd_tiny, zimage_tiny, flux1_tiny, klein_tiny).
# Usage: flags_honest.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
tests="$(cd "$(dirname "$0")/.." && pwd)"
ref="$data/reference"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() {
  echo "FAIL $1"
  fails=$((fails + 1))
}
png() { python3 "$(dirname "$0")/lib/pngtool.py" "$@"; }

source "$(dirname "$0")/lib/tiny.bash"

# the classification of every option (long name, or the short one when it has no long name)
declare -A class=(
  [--mode]="act cli/upscale.sh -M upscale"
  [--model]="act here"
  [--diffusion-model]="act cli/user_dual_gtx1660.sh"
  [--vae]="act cli/user_vulkan_rx590.sh"
  [--taesd]="act cli/placement_taesd.sh"
  [--clip_l]="warn zimage --clip_l.*Z-Image has no such text encoder|--clip_l $ref/clip_text_sd15_tiny.safetensors"
  [--clip_g]="warn klein --clip_g.*FLUX.2 Klein has no such text encoder|--clip_g $ref/clip_text_with_projection_tiny.safetensors"
  [--t5xxl]="warn zimage --t5xxl.*Z-Image has no such text encoder|--t5xxl $ref/t5_encoder_tiny.safetensors"
  [--llm]="act cli/user_dual_gtx1660.sh"
  [--type]="act cli/generate_errors.sh"
  [--prompt]="act here"
  [--negative-prompt]="act here"
  [--prompt-file]="act here"
  [--negative-prompt-file]="act here"
  [--clip-skip]="act unit/clip_text_test.cpp clip_skip"
  [--lora-model-dir]="act cli/lora_input.sh"
  [--lora-apply-mode]="act cli/lora_input.sh"
  [--lora]="act cli/lora_input.sh"
  [--embd-dir]="act unit/lora_apply_test.cpp TextualInversionEqualsHandEditedTokenEmbedding"
  [--cfg-scale]="act here"
  [--guidance]="warn zimage guidance 2: Z-Image has no distilled-guidance input|--guidance 2"
  [--steps]="act here"
  [--sampling-method]="act cli/samplers.sh"
  [--scheduler]="act cli/samplers.sh"
  [--sigmas]="act cli/samplers.sh"
  [--eta]="act cli/samplers.sh"
  [--flow-shift]="act e2e/zimage_tiny_e2e_test.cpp flow_shift"
  [--prediction]="warn klein prediction v: FLUX.2 Klein is a flow-matching model|--prediction v"
  [--seed]="act here"
  [--rng]="act unit/sampling_sampler_test.cpp rng"
  [--sampler-rng]="act here"
  [--width]="act here"
  [--height]="act here"
  [--batch-count]="act here"
  [--output]="act here"
  [--output-begin-idx]="act here"
  [--init-img]="act cli/user_vulkan_rx590.sh input.png --mask"
  [--mask]="act cli/user_vulkan_rx590.sh"
  [--strength]="act cli/placement_vae_encode.sh"
  [--ref-image]="act e2e/klein_tiny_e2e_test.cpp ref_images"
  [--vae-tiling]="act cli/user_vulkan_rx590.sh"
  [--vae-tile-size]="warn sd vae-tile-size 16x24: easel's VAE tiles are square|--vae-tiling --vae-tile-size 16x24"
  [--vae-tile-overlap]="act cli/generate_errors.sh"
  [--vae-relative-tile-size]="error sd vae-relative-tile-size 0.5x0.5: not in this build yet|--vae-tiling --vae-relative-tile-size 0.5x0.5"
  [--vae-conv-direct]="act here"
  [--upscale-model]="act cli/upscale.sh"
  [--hires]="act cli/hires.sh"
  [--hires-upscaler]="act cli/hires.sh"
  [--hires-upscalers-dir]="act cli/hires.sh"
  [--hires-scale]="act cli/hires.sh"
  [--hires-width]="act cli/hires.sh"
  [--hires-height]="act cli/hires.sh"
  [--hires-steps]="act cli/hires.sh"
  [--hires-denoising-strength]="act cli/hires.sh"
  [--hires-sigmas]="act cli/hires.sh"
  [--upscale-repeats]="act cli/upscale.sh"
  [--upscale-tile-size]="act cli/upscale.sh"
  [--fa]="act unit/vae_autoencoder_kl_test.cpp flash_attn"
  [--diffusion-fa]="act unit/memory_check_test.cpp diffusion_fa"
  [--diffusion-conv-direct]="warn zimage diffusion-conv-direct: Z-Image's diffusion model is a transformer with no convolutions|--diffusion-conv-direct"
  [--mmap]="act here"
  [--threads]="act cli/faults.sh"
  [--backend]="act cli/placement.sh"
  [--params-backend]="act cli/placement.sh"
  [--split-mode]="act cli/placement.sh"
  [--max-vram]="act cli/placement.sh"
  [--headroom]="act unit/placement_spec_test.cpp headroom"
  [--stream-layers]="act cli/placement.sh"
  [--offload-to-cpu]="act unit/placement_spec_test.cpp offload_to_cpu"
  [--clip-on-cpu]="act unit/placement_spec_test.cpp clip_on_cpu"
  [--vae-on-cpu]="act unit/placement_spec_test.cpp vae_on_cpu"
  [--auto-fit]="act cli/autofit.sh"
  [--save-embeddings]="act cli/stages_errors.sh"
  [--load-embeddings]="act cli/stages_errors.sh"
  [--save-latent]="act cli/placement.sh"
  [--load-latent]="act cli/stages_errors.sh"
  [--checkpoint-dir]="act cli/faults.sh"
  [--resume]="act cli/stages_errors.sh"
  [--resume-step]="act cli/bad_input.sh"
  [--full-fingerprint]="act pipeline/artifact_test.cpp full = model_fingerprint"
  [--cache-dir]="act cli/autofit.sh"
  [--no-cache]="act cli/autofit.sh"
  [--cache-max-mib]="act pipeline/artifact_test.cpp evicts the least recently used"
  [--stage]="act cli/stages_errors.sh"
  [--verbose]="act here"
  [--color]="act here"
  [--rpc-servers]="act cli/faults.sh --rpc-servers"
  [--help]="act here"
)

# 1. every option the help lists is classified
opts=$("$easel" generate --help | grep -oE '^ +(-[A-Za-z], ?)?--[A-Za-z0-9_-]+' | grep -oE -- '--[A-Za-z0-9_-]+' | sort -u)
[ -n "$opts" ] || { echo "FAIL easel generate --help lists no options"; exit 1; }
count=0
for o in $opts; do
  count=$((count + 1))
  [ -n "${class[$o]:-}" ] || bad "$o is in generate --help but not classified in flags_honest.sh (acts where? warns why?)"
done
ok "$count options in generate --help, each classified"

# 2. the classes
for o in $opts; do
  c="${class[$o]:-}"
  [ -n "$c" ] || continue
  kind=${c%% *}
  rest=${c#* }
  case "$kind" in
    warn | error)
      fam=${rest%% *}
      rest=${rest#* }
      regex=${rest%%|*}
      # shellcheck disable=SC2206
      args=(${rest#*|})
      rm -f "$tmp/w.png"
      run "$fam" "$tmp/w.png" "$tmp/w.log" "${args[@]}"
      rc=$?
      if [ "$kind" = warn ]; then
        n=$(grep -cE -e "$regex" "$tmp/w.log")
        if [ "$rc" -eq 0 ] && [ "$n" -eq 1 ] && [ -s "$tmp/w.png" ] && grep -E -e "$regex" "$tmp/w.log" | grep -q "^warning: "; then
          ok "$o on $fam: one warning: $(grep -E -e "$regex" "$tmp/w.log" | cut -c1-140)"
        else
          bad "$o on $fam: exit $rc, $n warning line(s) matching '$regex': $(grep -E 'warning|error' "$tmp/w.log" | head -3)"
        fi
      else
        if [ "$rc" -eq 1 ] && [ "$(grep -c '^error:' "$tmp/w.log")" -eq 1 ] && grep -qE -e "^error:.*$regex" "$tmp/w.log" && [ ! -e "$tmp/w.png" ]; then
          ok "$o on $fam: refused: $(grep '^error:' "$tmp/w.log" | cut -c1-140)"
        else
          bad "$o on $fam: exit $rc: $(grep -E 'error' "$tmp/w.log" | head -2)"
        fi
      fi
      ;;
    act)
      [ "$rest" = here ] && continue
      file=${rest%% *}
      pat=${rest#* }
      [ "$pat" = "$rest" ] && pat=$o
      if [ -f "$tests/$file" ] && grep -q -- "$pat" "$tests/$file"; then
        ok "$o acts: checked by tests/$file"
      else
        bad "$o: tests/$file does not check it (no '$pat' in it)"
      fi
      ;;
    *) bad "$o: unknown class '$kind'" ;;
  esac
done

# 3. the "act here" checks
# -m, -p, -W/-H, --steps, --cfg-scale, -s: the image's size and parameters text
run sd "$tmp/a.png" "$tmp/a.log" -W 72 -H 56 --steps 2 --cfg-scale 3.5 -s 11 -n "blurry" || bad "base SD job: $(grep -m1 error "$tmp/a.log")"
params=$(png text "$tmp/a.png" parameters)
[ "$(png size "$tmp/a.png")" = "72 56" ] && ok "--width/--height: 72x56" || bad "--width/--height: $(png size "$tmp/a.png")"
for want in "a red cat" "Negative prompt: blurry" "Steps: 2" "CFG scale: 3.5" "Seed: 11" "Size: 72x56"; do
  [[ "$params" == *"$want"* ]] && ok "-p/-n/--steps/--cfg-scale/-s: parameters text has '$want'" || bad "parameters text lacks '$want': $params"
done
# --prompt-file / --negative-prompt-file: the same PNG as -p / -n (one trailing newline dropped)
printf 'a red cat\n' >"$tmp/p.txt"
printf 'blurry\n' >"$tmp/n.txt"
"$easel" generate $(model_of sd) --prompt-file "$tmp/p.txt" --negative-prompt-file "$tmp/n.txt" -W 72 -H 56 --steps 2 --cfg-scale 3.5 -s 11 -t 1 --no-cache \
  -o "$tmp/f.png" >"$tmp/f.log" 2>&1 && cmp -s "$tmp/a.png" "$tmp/f.png" && ok "--prompt-file/--negative-prompt-file: same PNG as -p/-n" ||
  bad "--prompt-file/--negative-prompt-file: $(grep -m1 error "$tmp/f.log") (or the PNG differs)"
err=$("$easel" generate $(model_of sd) -p x --prompt-file "$tmp/p.txt" -o "$tmp/g.png" 2>&1 >/dev/null)
[ $? -eq 1 ] && [[ "$err" == *"either -p/--prompt or --prompt-file"* ]] && ok "-p with --prompt-file: refused" || bad "-p with --prompt-file: $err"
err=$("$easel" generate $(model_of sd) --prompt-file "$tmp/none.txt" -o "$tmp/g.png" 2>&1 >/dev/null)
[ $? -eq 1 ] && [[ "$err" == *"--prompt-file $tmp/none.txt: no such file"* ]] && ok "--prompt-file missing: refused" || bad "--prompt-file missing: $err"
# --sampler-rng: with an ancestral sampler, cpu noise gives another image than the default (cuda)
run sd "$tmp/r1.png" "$tmp/r1.log" --sampling-method euler_a --steps 2 && run sd "$tmp/r2.png" "$tmp/r2.log" --sampling-method euler_a --steps 2 --sampler-rng cpu &&
  ! cmp -s "$tmp/r1.png" "$tmp/r2.png" && ok "--sampler-rng cpu: another image than the default with euler_a" || bad "--sampler-rng: same image or failed"
# -b and -o: NAME.png, NAME_2.png; --output-begin-idx 5: NAME_5.png, NAME_6.png; %03d with it: 005, 006
run sd "$tmp/b.png" "$tmp/b.log" -b 2 && [ -s "$tmp/b.png" ] && [ -s "$tmp/b_2.png" ] && ok "-b 2 -o b.png: b.png, b_2.png" || bad "-b 2: $(ls "$tmp" | grep '^b')"
run sd "$tmp/c.png" "$tmp/c.log" -b 2 --output-begin-idx 5 && [ -s "$tmp/c_5.png" ] && [ -s "$tmp/c_6.png" ] && [ ! -e "$tmp/c.png" ] &&
  ok "--output-begin-idx 5 -b 2: c_5.png, c_6.png" || bad "--output-begin-idx 5: $(ls "$tmp" | grep '^c')"
run sd "$tmp/d_%03d.png" "$tmp/d.log" -b 2 --output-begin-idx 0 && [ -s "$tmp/d_000.png" ] && [ -s "$tmp/d_001.png" ] &&
  ok "--output-begin-idx 0 -o d_%03d.png: d_000.png, d_001.png" || bad "--output-begin-idx 0 with %03d: $(ls "$tmp" | grep '^d')"
# -o .jpg / .jpeg: a JPEG with the parameters as its comment; .webp: refused before anything runs
run sd "$tmp/j.jpg" "$tmp/j.log" && [ "$(png format "$tmp/j.jpg")" = jpeg ] && [[ "$(png text "$tmp/j.jpg" x)" == *"Steps: 1"* ]] &&
  [ "$(png size "$tmp/j.jpg")" = "64 64" ] && ok "-o x.jpg: a 64x64 JPEG with the parameters comment" || bad "-o x.jpg: $(grep -m1 error "$tmp/j.log")"
run sd "$tmp/j2.JPEG" "$tmp/j2.log" && [ "$(png format "$tmp/j2.JPEG")" = jpeg ] && ok "-o x.JPEG: a JPEG" || bad "-o x.JPEG"
run sd "$tmp/w.webp" "$tmp/w2.log"
[ $? -eq 1 ] && grep -q "^error:.*no WebP writer" "$tmp/w2.log" && ! grep -q "stage " "$tmp/w2.log" && [ ! -e "$tmp/w.webp" ] &&
  ok "-o x.webp: refused before anything runs" || bad "-o x.webp: $(tail -1 "$tmp/w2.log")"
# --mmap: -v says easel maps already; no warning
run sd "$tmp/m.png" "$tmp/m.log" --mmap -v && grep -q "mmap: easel memory-maps every model file" "$tmp/m.log" && ! grep -q "warning.*mmap" "$tmp/m.log" &&
  ok "--mmap: -v line, no warning" || bad "--mmap: $(grep -i mmap "$tmp/m.log")"
# --color: escape codes on the warning line; without it none
run sd "$tmp/k.png" "$tmp/k.log" --color --flow-shift 3 && grep -q $'\x1b\[' "$tmp/k.log" && run sd "$tmp/k2.png" "$tmp/k2.log" --flow-shift 3 &&
  ! grep -q $'\x1b\[' "$tmp/k2.log" && ok "--color: escape codes only with the flag" || bad "--color"
# --vae-conv-direct / --diffusion-conv-direct on SD: ggml_conv_2d_direct; the image equals im2col's within
# float rounding (<= 2/255), no warning, and the plan's VAE compute buffer (measured from the graph) drops
run sd "$tmp/c0.png" "$tmp/c0.log" && run sd "$tmp/c1.png" "$tmp/c1.log" --vae-conv-direct --diffusion-conv-direct &&
  d=$(png diff "$tmp/c0.png" "$tmp/c1.png") && [ "${d#max }" != "$d" ] && [ "$(echo "$d" | awk '{ print $2 }')" -le 2 ] &&
  ! grep -q "conv-direct" "$tmp/c1.log" && ok "--vae-conv-direct --diffusion-conv-direct: image within 2/255 of im2col's ($d), no warning" ||
  bad "--vae-conv-direct: ${d:-no image} $(grep -i "conv-direct\|error" "$tmp/c1.log" | head -2)"
vae_compute() { "$easel" plan $(model_of sd) -W 256 -H 256 "$@" 2>&1 | awk '$1 == "vae" { print $6 }'; }
c0=$(vae_compute) && c1=$(vae_compute --vae-conv-direct) &&
  awk -v a="$c0" -v b="$c1" 'BEGIN { exit !(a > 0 && b > 0 && b < a / 2) }' &&
  ok "--vae-conv-direct: plan's VAE compute buffer at 256 px $c0 -> $c1 MiB" || bad "--vae-conv-direct: plan's VAE compute '$c0' -> '$c1' MiB"
# -v: debug lines
grep -q "debug" "$tmp/m.log" && ok "-v: debug lines" || bad "-v: no debug line"
# easel generate with no arguments: refused (no 512x512 job on an empty prompt over output.png)
(cd "$tmp" && "$easel" generate >"$tmp/n.log" 2>&1)
[ $? -eq 1 ] && grep -q "^error: easel generate: nothing to do" "$tmp/n.log" && [ ! -e "$tmp/output.png" ] && ok "easel generate alone: refused" ||
  bad "easel generate alone: $(tail -1 "$tmp/n.log")"
# a missing file named by an unused model-file flag is an error, not a warning
run zimage "$tmp/x.png" "$tmp/x.log" --t5xxl "$tmp/none.safetensors"
[ $? -eq 1 ] && grep -q "^error: --t5xxl $tmp/none.safetensors: no such file" "$tmp/x.log" && ok "--t5xxl naming a missing file on Z-Image: error" ||
  bad "--t5xxl missing file: $(tail -1 "$tmp/x.log")"
# --guidance on FLUX.1 dev (it has the input): no warning
run flux1 "$tmp/g.png" "$tmp/g.log" --guidance 2 && ! grep -q "guidance 2:" "$tmp/g.log" && ok "--guidance on FLUX.1 dev: used, no warning" ||
  bad "--guidance on FLUX.1: $(grep -E 'guidance|error' "$tmp/g.log" | head -2)"
# --rpc-servers naming one server twice: one clear error
err=$("$easel" generate --rpc-servers 127.0.0.1:1,127.0.0.1:1 $(model_of sd) -p x -o "$tmp/q.png" 2>&1 >/dev/null)
[ $? -eq 1 ] && [[ "$err" == *"127.0.0.1:1 is listed twice"* ]] && ok "--rpc-servers A,A: refused naming the repeat" || bad "--rpc-servers A,A: $err"
# controlnet= / upscaler= placement entries with no module: one warning each
run sd "$tmp/p.png" "$tmp/p.log" --backend "controlnet=cpu,upscaler=cpu" && [ "$(grep -c 'places nothing' "$tmp/p.log")" -eq 2 ] &&
  ok "controlnet=/upscaler= entries: one warning each" || bad "controlnet=/upscaler=: $(grep -E 'places nothing|error' "$tmp/p.log")"

# --resume-step 0: the state before step 1 is the initial latent: the same PNG as a fresh run, no checkpoint file needed
run sd "$tmp/s0.png" "$tmp/s0.log" --steps 2 --checkpoint-dir "$tmp/ck0" --resume-step 0 && run sd "$tmp/s1.png" "$tmp/s1.log" --steps 2 &&
  cmp -s "$tmp/s0.png" "$tmp/s1.png" && ok "--resume-step 0: the fresh run's PNG" ||
  bad "--resume-step 0: $(grep -m1 error "$tmp/s0.log") (or the PNG differs from a fresh run)"

[ "$fails" -eq 0 ] && echo "all flag honesty checks passed" || echo "$fails flag honesty checks failed"
[ "$fails" -eq 0 ]
