#!/bin/bash
# --auto-fit's compute term in real FLOPs: `easel plan --auto-fit` on the demo model at 256x256
# counts each module's matmul FLOPs per evaluation from its graph (runtime::graph_flops through
# ModuleCosts::flops) and prints them; they must equal the figures of the demo's model card
# (models/demo/README.md: UNet 2.43 GFLOP per evaluation, VAE decoder 73.5 GFLOP, counted there
# with PyTorch's FlopCounterMode). With the device benchmark off the CPU's default is 2e11 FLOP/s,
# so the diffusion module's predicted time is at least 2.43e9 x 20 steps x 2 (CFG) / 2e11 =
# 0.486 s, plus loading its 13 MiB of weights at 1 GB/s (about 0.014 s): printed as 0.49 to 0.51.
# A second plan answers from the cache and prints the same figures.
# Usage: autofit_work.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
src="$(cd "$(dirname "$0")/../.." && pwd)"
model="$src/models/demo/easel-demo-shapes.safetensors"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export EASEL_AUTOFIT_BENCH=0
fails=0

check() {  # check LOG NAME
  local log="$1" name="$2" work secs
  work=$(grep -m1 "^  work per evaluation" "$log")
  if ! grep -q "diffusion 2.43 GFLOP" <<<"$work" || ! grep -q "vae 73.5 GFLOP" <<<"$work"; then
    echo "FAIL $name: expected diffusion 2.43 and vae 73.5 GFLOP per evaluation (model card), got: ${work:-no work line}"
    fails=$((fails + 1))
    return
  fi
  secs=$(grep -m1 "^  diffusion: tier" "$log" | grep -o "[0-9.]* s$" | cut -d' ' -f1)
  if ! awk -v s="${secs:-0}" 'BEGIN { exit !(s >= 0.48 && s <= 0.51) }'; then
    echo "FAIL $name: diffusion predicted ${secs:-?} s, expected 0.48-0.51 s (2.43e9 x 40 / 2e11 + loading)"
    fails=$((fails + 1))
    return
  fi
  echo "ok   $name: ${work#  }; diffusion predicted $secs s"
}

job=(-m "$model" -p "a cat" -W 256 -H 256 --steps 20 --cfg-scale 5 --cache-dir "$tmp/cache")
"$easel" plan "${job[@]}" --auto-fit >"$tmp/a.log" 2>&1 || { echo "FAIL plan: $(tail -1 "$tmp/a.log")"; exit 1; }
check "$tmp/a.log" "measured"
"$easel" plan "${job[@]}" --auto-fit >"$tmp/b.log" 2>&1 || { echo "FAIL second plan: $(tail -1 "$tmp/b.log")"; exit 1; }
grep -q "0 measured with ggml's graph allocator" "$tmp/b.log" || { echo "FAIL second plan measured again: $(grep 'compute buffers' "$tmp/b.log")"; fails=$((fails + 1)); }
check "$tmp/b.log" "from the cache"

[ "$fails" -eq 0 ] && echo "autofit_work: all checks passed"
exit $((fails > 0))
