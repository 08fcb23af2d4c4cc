#!/usr/bin/env bash
# Adopts the output of a GPU training run (device_call9.sh .. device_call11.sh) as the shipped demo model:
#   tools/demo-model/adopt_run.sh FILES_AT RUN_NAME [MODEL_PATH]
# FILES_AT: the run tool's files_at folder (model.partaa, model.partab, demo.tar, log; run 11 on also summary.json,
# grid.png, loss-log.csv). Joins the model parts, checks the sha256 printed in the run's log, writes the model to
# MODEL_PATH (default models/demo/easel-demo-shapes.safetensors; when that is a symlink, its target is written),
# copies the parity references (tests/data/reference/demo/), the model-card samples (models/demo/samples/:
# the run's diffusers samples; the card's grid is then regenerated with easel, tools/demo-model/easel_grid.sh)
# and the run's summary and loss log (tools/demo-model/RUN_NAME_summary.json, RUN_NAME-loss-log.csv,
# RUN_NAME_vae_check.png). The model card and loss-log.csv are left for a person.
set -euo pipefail
src=${1:?FILES_AT}; run=${2:?RUN_NAME}
root=$(cd "$(dirname "$0")/../.." && pwd)
dst=${3:-$root/models/demo/easel-demo-shapes.safetensors}
[ -L "$dst" ] && dst=$(readlink -f "$dst")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat "$src"/model.parta? > "$tmp/model.safetensors"
want=$(grep -o '^[0-9a-f]\{64\}  .*\.safetensors' "$src/log" | tail -1 | cut -d' ' -f1)
got=$(sha256sum "$tmp/model.safetensors" | cut -d' ' -f1)
[ "$want" = "$got" ] || { echo "sha256 mismatch: log $want, joined $got" >&2; exit 1; }
tar -C "$tmp" -xf "$src/demo.tar"
if [ -d "$tmp/demo/unet" ]; then u="$tmp/demo/unet"; else u="$tmp/demo"; fi  # runs 4-10 / run 11 on
cp "$tmp/model.safetensors" "$dst"
cp "$u"/reference/demo_ref_0.png "$u"/reference/demo_ref_0.safetensors "$u"/reference/demo_ref_1.png \
   "$u"/reference/demo_ref_1.safetensors "$u"/reference/cases.json "$root/tests/data/reference/demo/"
cp "$u"/samples/sample_*.png "$root/models/demo/samples/"
[ -f "$u/vae_check.png" ] && cp "$u/vae_check.png" "$root/tools/demo-model/${run}_vae_check.png"
if [ -f "$src/summary.json" ]; then
  cp "$src/summary.json" "$root/tools/demo-model/${run}_summary.json"
  cp "$src/loss-log.csv" "$root/tools/demo-model/${run}-loss-log.csv"
else
  cp "$u/train_summary.json" "$root/tools/demo-model/${run}_summary.json"
  { echo "stage,step,elapsed_s,lr,loss,detail"
    tail -n +2 "$u/loss-log-unet.csv" | awk -F, -v s="$run" '{printf "%s,%s,%s,%s,%s,smoothed=%s\n", s, $1, $2, $3, $4, $5}'; } \
    > "$root/tools/demo-model/${run}-loss-log.csv"
fi
echo "adopted $run: sha256 $got -> $dst"
python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))
print('recommended', s.get('recommended'), 'weights', s.get('weights_chosen'))
for k, v in (s.get('settings') or s.get('accuracy') or {}).items(): print(k, v)
print('phrasings', s.get('phrasings'))" "$root/tools/demo-model/${run}_summary.json"
