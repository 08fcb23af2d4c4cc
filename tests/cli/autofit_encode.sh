#!/bin/bash
# --auto-fit plans the img2img encode stage: the VAE encoder runs in its own stage under the
# decoder's `vae` entry, so the planner places the VAE where the encoder fits too. Tiny SD
# pipeline, 256x256 init image, two `easel rpc-server`s: the encoder's graph needs more than the
# decoder's, and RPC0 is capped between the two needs. Checks:
#   - the decoder's placement alone (vae whole on RPC0, untiled) is refused by the plan for its
#     encode stage (what auto-fit chose before it planned the encoder);
#   - with RPC0 alone, auto-fit tiles the VAE so that the encoder's tiles fit, the run succeeds,
#     the measured peak equals the prediction (within 10%) and stays under the cap, and the
#     image equals the plain CPU run's with the same tiling;
#   - with RPC1 uncapped beside it, auto-fit moves the VAE whole to RPC1 (faster than tiling)
#     and the image equals the plain untiled CPU run's.
# Usage: autofit_encode.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
model="$data/reference/sd_tiny/sd_tiny.safetensors"
source "$(dirname "$0")/lib/rpc.bash"
start_rpc_pair  # $tmp, $port0, $port1, $rpc, fails=0
export EASEL_AUTOFIT_BENCH=0  # (the device speeds do not decide these plans; skip the benchmark)
one="--rpc-servers 127.0.0.1:$port0"

fail() {
  echo "FAIL $1"
  fails=$((fails + 1))
}

"$easel" generate -m "$model" -p "a cat" -W 256 -H 256 --steps 1 -s 1 -t 1 --backend cpu -o "$tmp/init.png" >"$tmp/init.log" 2>&1 ||
  { echo "FAIL init image: $(tail -1 "$tmp/init.log")"; exit 1; }
job=(-m "$model" -p "a cat" -i "$tmp/init.png" --strength 0.5 --steps 2 -s 1 -t 1 --no-cache)

# the uncapped needs of the vae (decoder) and vae-encode stages on RPC0, from the stage table
"$easel" plan "${job[@]}" $one --backend "te=RPC0,diffusion=RPC0,vae=RPC0" >"$tmp/need.log" 2>&1 ||
  { echo "FAIL uncapped plan: $(tail -1 "$tmp/need.log")"; exit 1; }
read -r dec encn < <(awk '$1 == "device" && $5 == "vae-encode" { t = 1; next } t && $1 ~ /^RPC0/ { print $4, $5; exit }' "$tmp/need.log")
if [ -z "${encn:-}" ] || ! awk -v d="$dec" -v e="$encn" 'BEGIN { exit !(e > d + 1) }'; then
  echo "FAIL setup: the encoder must need more than the decoder on RPC0 (decoder ${dec:-?} MiB, encoder ${encn:-?} MiB)"
  exit 1
fi
cap=$(awk -v d="$dec" -v e="$encn" 'BEGIN { printf "%.1f", (d + e) / 2 }')
capg=$(awk -v c="$cap" 'BEGIN { printf "%.6f", c / 1024 }')
echo "     decoder $dec MiB, encoder $encn MiB on RPC0: cap $cap MiB"

# the decoder's placement alone does not fit the encode stage: refused before anything runs
if "$easel" plan "${job[@]}" $one --backend "te=RPC0,diffusion=RPC0,vae=RPC0" --max-vram "RPC0=$capg" >"$tmp/untiled.log" 2>&1; then
  fail "vae whole on RPC0 under a $cap MiB cap was planned, but its encoder needs $encn MiB"
elif ! grep -q "the image encode (vae-encode stage, the VAE encoder): vae needs" "$tmp/untiled.log"; then
  fail "the refusal does not name the image encode: $(tail -1 "$tmp/untiled.log")"
else
  echo "ok   untiled vae on RPC0 refused: $(grep -i "error" "$tmp/untiled.log" | head -1 | cut -c1-160)"
fi

# run_fit NAME REFERENCE_FLAGS RPC_FLAG: an auto-fit img2img run under the cap; the image must equal the
# plain CPU run with the plan's tiling, each measured RPC peak within 10% of its prediction and
# RPC0's under the cap; prints the plan's flags line into $flags
run_fit() {
  local name="$1" rpcs="$2"
  flags=""
  if ! "$easel" generate "${job[@]}" $rpcs --auto-fit --max-vram "RPC0=$capg" -o "$tmp/out.png" >"$tmp/out.log" 2>&1; then
    fail "$name: $(grep -i error "$tmp/out.log" | head -1)"
    return 1
  fi
  flags=$(grep -m1 "^  --backend" "$tmp/out.log")
  local tiling
  tiling=$(grep -o -- "--vae-tiling --vae-tile-size [0-9]*x[0-9]*" <<<"$flags")
  "$easel" generate "${job[@]}" --backend cpu $tiling -o "$tmp/plain.png" >"$tmp/plain.log" 2>&1 ||
    { fail "$name: plain CPU run ($tiling): $(tail -1 "$tmp/plain.log")"; return 1; }
  cmp -s "$tmp/plain.png" "$tmp/out.png" || { fail "$name: image differs from the plain CPU run ($flags)"; return 1; }
  # the last "predicted measured" table of the run (after the decode: every stage has run)
  local rows bad
  rows=$(awk '/measured beside the plan.s prediction/ { rows = ""; t = 1; next }
              t && $1 ~ /^RPC[01]/ && NF == 3 && $3 ~ /^[0-9.]+$/ { rows = rows $1 " " $2 " " $3 "\n" } END { printf "%s", rows }' "$tmp/out.log")
  [ -n "$rows" ] || { fail "$name: no measured peak printed ($flags)"; return 1; }
  bad=$(printf '%s\n' "$rows" | awk -v cap="$cap" 'NF == 3 {
      if ($3 > $2 * 1.10 || $3 < $2 * 0.90) print "measured " $3 " MiB vs predicted " $2 " MiB on " $1;
      else if ($1 ~ /^RPC0/ && $3 > cap + 0.05) print "measured " $3 " MiB above the cap " cap " MiB on RPC0" }')
  [ -z "$bad" ] || { fail "$name: $bad"; return 1; }
  echo "ok   $name: $flags; peaks (predicted/measured MiB) $(printf '%s\n' "$rows" | awk 'NF == 3 { printf "%s %s/%s  ", substr($1, 1, 4), $2, $3 }')"
}

# RPC0 alone: the VAE tiled so that the encoder's tiles fit
if run_fit "auto-fit img2img, RPC0 capped at $cap MiB" "$one"; then
  grep -q -- "--vae-tiling" <<<"$flags" || fail "RPC0 alone: expected a tiled VAE, got: $flags"
  grep -q "vae encoder .*vae-encode" "$tmp/out.log" || fail "RPC0 alone: the reasons do not name the encoder's stage"
fi
# RPC1 uncapped beside it: the VAE whole on RPC1
if run_fit "auto-fit img2img, RPC0 capped, RPC1 free" "$rpc"; then
  grep -q 'vae=RPC1' <<<"$flags" || fail "RPC1 free: expected vae=RPC1, got: $flags"
  if grep -q -- "--vae-tiling" <<<"$flags"; then fail "RPC1 free: expected no tiling, got: $flags"; fi
fi

# the stage command plans with --auto-fit too: `easel encode-image` under the cap, its peak the prediction
if "$easel" encode-image -m "$model" -i "$tmp/init.png" -t 1 $one --auto-fit --max-vram "RPC0=$capg" --save-latent "$tmp/lat.safetensors" >"$tmp/enc.log" 2>&1 &&
  grep -q "^auto-fit plan" "$tmp/enc.log"; then
  row=$(awk '/measured beside the plan.s prediction/ { t = 1; next } t && $1 ~ /^RPC0/ && NF == 3 { print $2, $3; exit }' "$tmp/enc.log")
  if [ -n "$row" ] && awk -v r="$row" -v cap="$cap" 'BEGIN { split(r, a, " "); exit !(a[1] == a[2] && a[2] <= cap) }'; then
    echo "ok   encode-image --auto-fit: RPC0 predicted/measured $row MiB, cap $cap"
  else
    fail "encode-image --auto-fit: RPC0 predicted/measured '${row:-none}' (cap $cap)"
  fi
else
  fail "encode-image --auto-fit: $(grep -i -m1 error "$tmp/enc.log" || echo 'no auto-fit plan printed')"
fi
# --load-latent: auto-fit plans at the latent's size (256 px here), not at -W/-H's default 512, whose
# UNet would not fit the cap (before: planned at 512 and refused)
if [ -f "$tmp/lat.safetensors" ]; then
  if "$easel" plan -m "$model" -p "a cat" $one --auto-fit --max-vram "RPC0=$capg" --load-latent "$tmp/lat.safetensors" >"$tmp/ll.log" 2>&1 &&
    grep -q "^job: 256x256 pixels" "$tmp/ll.log" && grep -q "^  diffusion: tier [12] " "$tmp/ll.log"; then
    echo "ok   plan --auto-fit --load-latent: $(grep -m1 '^job:' "$tmp/ll.log"); $(grep -m1 '^  diffusion: tier' "$tmp/ll.log" | cut -c1-60)"
  else
    fail "plan --auto-fit --load-latent: $(grep -m1 -E '^job:|error' "$tmp/ll.log")"
  fi
fi

[ "$fails" -eq 0 ] && echo "autofit_encode: all checks passed"
exit $((fails > 0))
