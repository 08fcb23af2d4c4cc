#!/bin/bash
# The cases of the second new-user tryout (issue 20): flags accepted for a job they do not act on
# get exactly one warning line naming the flag and why (the image is still written), and plainly
# invalid values one "error:" line naming the flag, exit 1, nothing written, no stage run. A
# sibling of flags_honest.sh (which classifies every option of the help; these are the flag
# combinations it does not reach).
# Usage: flags_honest_cases.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
ref="$data/reference"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() {
  echo "FAIL $1"
  fails=$((fails + 1))
}

source "$(dirname "$0")/lib/tiny.bash"

# warns NAME FAMILY LITERAL ARGS...: exit 0, the image written, exactly one warning line, and it
# holds LITERAL
warns() {
  local name="$1" fam="$2" want="$3"
  shift 3
  rm -f "$tmp/w.png"
  run "$fam" "$tmp/w.png" "$tmp/w.log" "$@"
  local rc=$? n
  n=$(grep -c "^warning: " "$tmp/w.log")
  if [ "$rc" -eq 0 ] && [ -s "$tmp/w.png" ] && [ "$n" -eq 1 ] && grep "^warning: " "$tmp/w.log" | grep -qF -- "$want"; then
    ok "$name: $(grep '^warning: ' "$tmp/w.log" | cut -c1-150)"
  else
    bad "$name: exit $rc, $n warning line(s), want one with '$want': $(grep -E '^(warning|error)' "$tmp/w.log" | head -3)"
  fi
}

# refused NAME FAMILY LITERAL ARGS...: exit 1, one "error:" line holding LITERAL, no stage ran, no image
refused() {
  local name="$1" fam="$2" want="$3"
  shift 3
  rm -f "$tmp/r.png"
  run "$fam" "$tmp/r.png" "$tmp/r.log" "$@"
  local rc=$?
  if [ "$rc" -eq 1 ] && [ "$(grep -c '^error:' "$tmp/r.log")" -eq 1 ] && grep '^error:' "$tmp/r.log" | grep -qF -- "$want" &&
    ! grep -q "^stage \|stage te\|denois" "$tmp/r.log" && [ ! -e "$tmp/r.png" ]; then
    ok "$name: $(grep '^error:' "$tmp/r.log" | cut -c1-150)"
  else
    bad "$name: exit $rc: $(grep -E '^(error|warning)|stage' "$tmp/r.log" | head -3)"
  fi
}

# --flow-shift on models that are not flow-matching (SD1.x eps, SDXL eps)
warns "--flow-shift on SD1.x" sd "--flow-shift 3: SD1.x is not a flow-matching model (its prediction is eps)" --flow-shift 3
warns "--flow-shift on SDXL" sdxl "--flow-shift 3: SDXL is not a flow-matching model (its prediction is eps)" --flow-shift 3
# --hires-* without --hires: one line naming every one given
warns "--hires-scale/--hires-steps without --hires" sd "--hires-scale, --hires-steps: not used: the hires fix is off; add --hires" \
  --hires-scale 1.5 --hires-steps 2
# --strength without an init image
warns "--strength without -i" sd "--strength 0.5: not used without an init image" --strength 0.5
# --upscale-repeats / --upscale-tile-size without --upscale-model
warns "--upscale-repeats/--upscale-tile-size without --upscale-model" sd \
  "--upscale-repeats, --upscale-tile-size: not used without --upscale-model" --upscale-repeats 2 --upscale-tile-size 64
# --vae-tile-size / --vae-tile-overlap without --vae-tiling
warns "--vae-tile-size/--vae-tile-overlap without --vae-tiling" sd "--vae-tile-size, --vae-tile-overlap: not used without --vae-tiling" \
  --vae-tile-size 16x16 --vae-tile-overlap 0.25
# --clip-skip on families that take no CLIP hidden layer
warns "--clip-skip on Z-Image" zimage "--clip-skip 2: Z-Image takes no hidden layer of a CLIP text encoder" --clip-skip 2
warns "--clip-skip on FLUX.1" flux1 "--clip-skip 2: FLUX.1 dev takes no hidden layer of a CLIP text encoder" --clip-skip 2
warns "--clip-skip on FLUX.2 Klein" klein "takes no hidden layer of a CLIP text encoder" --clip-skip 2
# ... and where they act, no warning: --clip-skip on SD, --strength with -i, --vae-tile-size with --vae-tiling
run sd "$tmp/i.png" "$tmp/i.log" && run sd "$tmp/n.png" "$tmp/n.log" --clip-skip 2 -i "$tmp/i.png" --strength 0.5 --steps 4 --vae-tiling --vae-tile-size 16x16 &&
  ! grep -q "^warning" "$tmp/n.log" && ok "--clip-skip on SD, --strength with -i, --vae-tile-size with --vae-tiling: no warning" ||
  bad "flags that act warned or failed: $(grep -E '^(warning|error)' "$tmp/n.log" | head -2)"

# -o: an unknown extension is refused naming the ones written; no extension: PNG, one warning
refused "-o x.bmp" sd "no BMP writer: name the output .png" -o "$tmp/x.bmp"
[ ! -e "$tmp/x.bmp" ] || bad "-o x.bmp: a file was written"
rm -f "$tmp/noext"
run sd "$tmp/noext" "$tmp/noext.log"
rc=$?
[ $rc -eq 0 ] && python3 "$(dirname "$0")/lib/pngtool.py" format "$tmp/noext" | grep -qx png && [ "$(grep -c '^warning: ' "$tmp/noext.log")" -eq 1 ] &&
  grep -qF "warning: -o $tmp/noext: no file extension: writing PNG" "$tmp/noext.log" && ok "-o without an extension: a PNG and one warning" ||
  bad "-o without an extension: exit $rc: $(grep -E '^(warning|error)' "$tmp/noext.log" | head -2)"

# SD with a TAEF2 (FLUX.2, 32-channel) decoder: refused when the model is opened, before any stage
refused "SD + --taesd TAEF2" sd "a 32-channel tiny autoencoder; SD1.x latents have 4 channels" --taesd "$ref/autoencoder_tiny_taef2_decoder.safetensors"
# Z-Image with an SD TAESD (4 channels)
refused "Z-Image + --taesd TAESD" zimage "a 4-channel tiny autoencoder; Z-Image latents have 16 channels" --taesd "$ref/autoencoder_tiny_taesd_tiny.safetensors"

# plainly invalid values: one error line naming the flag
refused "--sigmas \"\"" sd "--sigmas is empty: give the sigmas comma-separated" --sigmas ""
refused "--hires-sigmas \"\"" sd "--hires-sigmas is empty" --hires --hires-sigmas " "
refused "--cfg-scale 1e30" sd "--cfg-scale 1e+30 is outside 0..100" --cfg-scale 1e30
refused "--cfg-scale nan" sd "--cfg-scale nan is outside 0..100" --cfg-scale nan
refused "--steps abc" sd "--steps: abc is not a whole number: pass a whole number from 1 to 10000" --steps abc
refused "--steps 0" sd "--steps: 0 is outside the range: pass a whole number from 1 to 10000" --steps 0
refused "--strength x" sd "--strength: x is not a number: pass a number from 0 to 1" --strength x
printf 'a red \xff cat\n' >"$tmp/latin1.txt"
rm -f "$tmp/r.png"
"$easel" generate $(model_of sd) --prompt-file "$tmp/latin1.txt" -W 64 -H 64 --steps 1 -t 1 --no-cache -o "$tmp/r.png" >"$tmp/r.log" 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(grep -c '^error:' "$tmp/r.log")" -eq 1 ] &&
  grep -qF "error: --prompt-file $tmp/latin1.txt: not UTF-8 text (byte 0xFF at offset 6); save the file as UTF-8" "$tmp/r.log" && [ ! -e "$tmp/r.png" ] &&
  ok "--prompt-file not UTF-8: refused naming the file and the byte" || bad "--prompt-file not UTF-8: exit $rc: $(grep error "$tmp/r.log")"

# a refused --resume-step leaves no .easel.lock behind (a new folder and one that holds checkpoints)
refused "--resume-step past --steps" sd "--resume-step 5 is past --steps 1" --checkpoint-dir "$tmp/ck" --resume-step 5
[ ! -e "$tmp/ck/.easel.lock" ] && ok "refused --resume-step: no .easel.lock left in the new folder" || bad "refused --resume-step: $tmp/ck/.easel.lock left behind"
run sd "$tmp/c.png" "$tmp/c.log" --steps 2 --checkpoint-dir "$tmp/ck2" || bad "checkpointed run: $(grep -m1 error "$tmp/c.log")"
[ ! -e "$tmp/ck2/.easel.lock" ] && ok "a finished checkpointed run: no .easel.lock left" || bad "a finished run left $tmp/ck2/.easel.lock"
refused "--resume-step with no such checkpoint" sd "--resume-step 1: no checkpoint" --checkpoint-dir "$tmp/ck3" --resume-step 1
[ ! -e "$tmp/ck3/.easel.lock" ] && ok "refused --resume-step (no checkpoint): no .easel.lock left" || bad "$tmp/ck3/.easel.lock left behind"

[ "$fails" -eq 0 ] && echo "all flag honesty cases passed" || echo "$fails flag honesty cases failed"
[ "$fails" -eq 0 ]
