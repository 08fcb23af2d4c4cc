# GPU-machine run 7: text encoder + UNet from scratch with the "lowattn" UNet (tools/demo-model/archs.py:
# attention at the 16x16 and 8x8 latent levels, 8 heads of 8 / 16 channels, none at 32x32), run 6's recipe
# otherwise (pre-encoded latent pool, fused AdamW, Min-SNR-5, batch 256, lr 6e-4, offset noise 0.3), VAE of the
# shipped file. Training is time-bounded twice: --time (at most) and --end-by (the whole Python job, export,
# accuracy at 4 CFG scales, test prompts, samples and parity references included, ends by T0 + 525 s, with
# 75 s kept for everything after training). Then the model is split in two parts, the rest tarred.
# Usage (repo root, $OUT set): bash tools/reference/device_call7.sh   (run tool: timeout_s 600,
# carry [".carry/diffusers.tar.xz", ".carry/demo-vae.safetensors"]; ends by about 540 s after it starts)
# Back in $OUT: model.partaa, model.partab (the f16 single file, about 29.9 MB), demo.tar (demo/unet:
# train_summary.json, loss-log-unet.csv, samples/, reference/), log (its sha256 line is what
# tools/demo-model/adopt_run.sh checks).
set -o pipefail
T0=$(date +%s)
source tools/reference/device_setup.sh
{
date +%T; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)"
ARGS="unet --arch lowattn --tok tests/data/reference/sd_tiny/diffusers/tokenizer --out $W/unet --vae-from .carry/demo-vae.safetensors --batch 256 --lr 6e-4 --warmup 300 --min-snr 5 --offset-noise 0.3 --pool 131072 --pool-time 40 --cfgs 2,3.5,5,7.5 --ref-cfg auto --end-by $((T0 + 525)) --reserve 75"
timeout $((T0 + 548 - $(date +%s))) python3 tools/demo-model/train.py $ARGS --time ${UNET_TIME:-420} --channels-last auto --fused || {
  echo "FAILED unet (run 7) after $(( $(date +%s) - T0 )) s"
  if [ ! -f $W/unet/easel-demo-shapes.safetensors ] && [ $(( $(date +%s) - T0 )) -lt 150 ]; then
    # once more without the two speed options (channels_last timing, fused AdamW), same deadline
    timeout $((T0 + 548 - $(date +%s))) python3 tools/demo-model/train.py $ARGS --time 300 --channels-last no || echo "FAILED unet (run 7, plain)"
  fi
}
date +%T
sha256sum $W/unet/easel-demo-shapes.safetensors && split -b 15m $W/unet/easel-demo-shapes.safetensors $OUT/model.part
rm -f $W/unet/easel-demo-shapes.safetensors; mkdir -p $W/demo; cp -r $W/unet $W/demo/
tar -C $W -cf $OUT/demo.tar demo
date +%T; echo "total $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/log
