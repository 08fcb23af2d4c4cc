# GPU-machine run "samplers" (issue 26): reference trajectories of every sampler and scheduler
# (tools/reference/sampler_refs.py; its docstring lists the references and the outputs).
# Needs k-diffusion's source as .kdiff/ (the folder holding k_diffusion/) and diffusers' as .diffusers/
# (the folder holding diffusers/, or a checkout with src/diffusers/) at the repository root, and the demo
# model models/demo/easel-demo-shapes.safetensors as a regular file (MODEL=path overrides).
# Usage (repo root, $OUT set): bash tools/reference/device_call_samplers.sh
#   (run tool: timeout_s 600, carry [".kdiff", ".diffusers"]; CPU only, a few minutes)
# Back in $OUT: samplers.json, samplers.safetensors (-> tests/data/reference/samplers/), log.
set -o pipefail
T0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
MODEL=${MODEL:-models/demo/easel-demo-shapes.safetensors}
{
date +%T; nproc; python3 -c "import torch, scipy; print('torch', torch.__version__, 'scipy', scipy.__version__)"
timeout 560 python3 tools/reference/sampler_refs.py --kdiff .kdiff --diffusers .diffusers --demo "$MODEL" --out $OUT \
    || echo "FAILED sampler_refs after $(( $(date +%s) - T0 )) s"
ls -la $OUT
date +%T; echo "total $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/log
