# GPU-machine run 9: run 7 (tools/reference/device_call7.sh: "lowattn" UNet, text encoder + UNet from scratch,
# VAE of the shipped file, batch 256, lr 6e-4, offset noise 0.3) with a zero-terminal-SNR schedule and
# v-prediction (--zsnr; Lin et al. 2023, arXiv:2305.08891) instead of epsilon and Min-SNR: at t = 999 the
# latent keeps nothing of the image, so the object's position can only come from the prompt
# (tools/demo-model/README.md, "The side"). Also dumps diffusers' EulerDiscreteScheduler tables for the
# zero-SNR config (zsnr_sched.json) as the reference for easel's schedule.
# Time-bounded as run 8 (--end-by T0 + END, default 430 s; killed at T0 + END + 20 s).
# Usage (repo root, $OUT set): bash tools/reference/device_call9.sh   (run tool: timeout_s 600,
# carry [".carry/diffusers.tar.xz", ".carry/demo-vae.safetensors"])
# Back in $OUT: model.partaa, model.partab, demo.tar, zsnr_sched.json, log.
set -o pipefail
T0=$(date +%s)
END=${END:-430}
source tools/reference/device_setup.sh
{
date +%T; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 - <<'PY' > $OUT/zsnr_sched.json
import json
from diffusers import EulerDiscreteScheduler
base = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
            prediction_type="v_prediction", rescale_betas_zero_snr=True, steps_offset=1)
out = {}
for spacing in ("linspace", "trailing", "leading"):
    s = EulerDiscreteScheduler(**base, timestep_spacing=spacing)
    r = {"alphas_cumprod": [float(x) for x in s.alphas_cumprod], "train_sigmas": [float(x) for x in s.sigmas]}
    for n in (1, 4, 20):
        s.set_timesteps(n)
        r[f"steps{n}"] = {"sigmas": [float(x) for x in s.sigmas], "timesteps": [float(x) for x in s.timesteps],
                          "init_noise_sigma": float(s.init_noise_sigma)}
    out[spacing] = r
print(json.dumps({"config": base, "diffusers": "EulerDiscreteScheduler", "spacings": out}))
PY
ARGS="unet --arch lowattn --zsnr --tok tests/data/reference/sd_tiny/diffusers/tokenizer --out $W/unet --vae-from .carry/demo-vae.safetensors --batch 256 --lr 6e-4 --warmup 300 --offset-noise 0.3 --pool 131072 --pool-time 30 --cfgs 2,3.5,5,7.5 --ref-cfg auto --end-by $((T0 + END)) --reserve 50"
timeout $((T0 + END + 20 - $(date +%s))) python3 tools/demo-model/train.py $ARGS --time 420 --channels-last yes --fused || echo "FAILED unet (run 9) after $(( $(date +%s) - T0 )) s"
date +%T
sha256sum $W/unet/easel-demo-shapes.safetensors && split -b 15m $W/unet/easel-demo-shapes.safetensors $OUT/model.part
rm -f $W/unet/easel-demo-shapes.safetensors; mkdir -p $W/demo; cp -r $W/unet $W/demo/
tar -C $W -cf $OUT/demo.tar demo
date +%T; echo "total $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/log
