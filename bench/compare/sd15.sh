#!/usr/bin/env bash
# SD1.5 UNet, easel against diffusers on the same made-up F16 weights, in one run on one GPU.
# Usage (GPU machine, repo root, after tools/device/build_cuda.sh and with diffusers on PYTHONPATH):
#   bench/compare/sd15.sh BUILD_DIR OUT_JSON [SIZE]
# Runs easel-bench's UNet at batch 1 and 2 (CUDA graphs on, off; flash attention on, off) and
# sd15_unet_diffusers.py at batch 1 and 2, and writes OUT_JSON with easel_step_s / diffusers_step_s:
# one CFG step (two conditionings) as each runs it today: easel two batch-1 evaluations, diffusers
# one batch-2 evaluation; every figure is a median of one run.
set -eo pipefail
build="${1:?build dir}"; out="${2:?output json}"; size="${3:-512}"
w=/tmp/easel-compare-sd15-unet.safetensors
tmp=$(mktemp -d)
bench="$build/bench/easel-bench"
run() { local name="$1"; shift; echo "== easel $name: $*"; "$@" --json "$tmp/$name.json" | grep -E "unet|median" | tail -2; }
run b1 "$bench" --only unet --size "$size" --unet-weights "$w" --batch 1 --reps 10 --warmup 2
run b2 "$bench" --only unet --size "$size" --unet-weights "$w" --batch 2 --reps 10 --warmup 2
run b1_fa "$bench" --only unet --size "$size" --unet-weights "$w" --batch 1 --reps 10 --warmup 2 --fa
run b2_fa "$bench" --only unet --size "$size" --unet-weights "$w" --batch 2 --reps 10 --warmup 2 --fa
GGML_CUDA_DISABLE_GRAPHS=1 run b1_nographs "$bench" --only unet --size "$size" --unet-weights "$w" --batch 1 --reps 10 --warmup 2
GGML_CUDA_DISABLE_GRAPHS=1 run b2_nographs "$bench" --only unet --size "$size" --unet-weights "$w" --batch 2 --reps 10 --warmup 2
echo "== diffusers"
env -u LD_LIBRARY_PATH python3 "$(dirname "$0")/sd15_unet_diffusers.py" --weights "$w" --size "$size" --batch 1 2 --json "$tmp/diffusers.json"
python3 - "$tmp" "$out" "$size" <<'PY'
import json, sys, os
tmp, out, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
def med(n):
    d = json.load(open(os.path.join(tmp, n + ".json")))
    m = [x for x in d["results"] if x["what"] == "unet"][0] if "results" in d else d
    return m
e = {n: med(n) for n in ["b1", "b2", "b1_fa", "b2_fa", "b1_nographs", "b2_nographs"]}
dif = json.load(open(os.path.join(tmp, "diffusers.json")))
dr = {r["batch"]: r for r in dif["runs"]}
best_b1 = min(e["b1"]["median_s"], e["b1_fa"]["median_s"])
res = {
    "family": "sd15", "what": f"UNet step at {size}x{size}, CFG (two conditionings), F16 weights",
    "easel_step_s": 2 * e["b1"]["median_s"],
    "easel_step_s_note": "as the pipeline runs a CFG step today: two batch-1 UNet evaluations (CUDA graphs on, no flash attention)",
    "easel_step_s_batch2": e["b2"]["median_s"],
    "easel_step_s_fa": 2 * e["b1_fa"]["median_s"],
    "easel_step_s_batch2_fa": e["b2_fa"]["median_s"],
    "easel_step_s_nographs": 2 * e["b1_nographs"]["median_s"],
    "easel_step_s_batch2_nographs": e["b2_nographs"]["median_s"],
    "diffusers_step_s": dr[2]["median_s"],
    "diffusers_eval_s_batch1": dr[1]["median_s"],
    "ratio_easel_over_diffusers": 2 * best_b1 / dr[2]["median_s"],
    "ratio_batch2_over_diffusers": min(e["b2"]["median_s"], e["b2_fa"]["median_s"]) / dr[2]["median_s"],
    "easel_peak_bytes_batch2": e["b2"].get("compute_bytes", 0) + e["b2"].get("param_bytes", 0),
    "diffusers_peak_bytes_batch2": dr[2]["peak_bytes"],
    "easel": e, "diffusers": dif,
}
json.dump(res, open(out, "w"), indent=1)
print(json.dumps({k: v for k, v in res.items() if k not in ("easel", "diffusers")}, indent=1))
PY
