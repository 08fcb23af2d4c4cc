# GPU-machine run "dpm" (tryout finding F19): diffusers' DPMSolverMultistepScheduler (dpmsolver++, order 2,
# Karras / linspace sigmas), EulerDiscreteScheduler and HeunDiscreteScheduler (exponential / linspace sigmas) on
# the bundled demo model (v-prediction, zero terminal SNR), CPU float32, noise of torch.Generator("cpu")
# seeded 42 (= easel --rng cpu -s 42). Script: tools/reference/dpm_check.py (its docstring lists the outputs).
# Usage (repo root, $OUT set): bash tools/reference/device_call_dpm.sh
#   (run tool: timeout_s 600, carry [".carry/diffusers.tar.xz", ".carry/run9.safetensors"]; the model is
#   models/demo/easel-demo-shapes.safetensors when it travels as a regular file, else .carry/run9.safetensors,
#   the same bytes, sha256 b03c0dca...; MODEL=path overrides)
# Back in $OUT (at most 8 files come back): summary.json, log, dpm.tar (dpm/<case>.png, dpm/<case>.safetensors
# and dpm/summary.json for the 11 cases, about 5 MB).
set -o pipefail
T0=$(date +%s)
source tools/reference/device_setup.sh
if [ -z "$MODEL" ]; then
    MODEL=models/demo/easel-demo-shapes.safetensors
    { [ -f $MODEL ] && [ ! -L $MODEL ]; } || MODEL=.carry/run9.safetensors
fi
{
date +%T; nproc
timeout 520 python3 tools/reference/dpm_check.py --model $MODEL \
    --tok tests/data/reference/sd_tiny/diffusers/tokenizer --out $W/dpm || echo "FAILED dpm_check after $(( $(date +%s) - T0 )) s"
cp $W/dpm/summary.json $OUT/ ; tar -C $W -cf $OUT/dpm.tar dpm
sha256sum $MODEL
date +%T; echo "total $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/log
