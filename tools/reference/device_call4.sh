# GPU-machine run 4: the demo model's text encoder + UNet trained again from scratch with the faster
# loop (pre-encoded latent pool, fused AdamW, Min-SNR-5, batch 256), keeping the trained VAE
# (.carry/demo-vae.safetensors = the first_stage_model.* tensors of the run-3 file, byte for byte;
# the whole file does not fit the 64 MiB the run may carry). Then export, accuracy at 4 CFG scales,
# the measured-check test's prompts, model-card samples and the diffusers parity references.
# Usage (repo root, $OUT set): bash tools/reference/device_call4.sh ($EXTRA: more train.py options, empty in run 4)
# The CLIP tokenizer is the one saved with tests/data/reference/sd_tiny (OpenAI's BPE vocabulary, 77 tokens,
# padded with <|endoftext|>), the same files tools/reference/dump_clip_tokens.py --tok-dir writes.
# carry: .carry/diffusers.tar.xz .carry/demo-vae.safetensors (the tree must stay under 64 MiB)
set -o pipefail
source tools/reference/device_setup.sh
T0=$(date +%s)
{
date +%T; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
ARGS="--tok tests/data/reference/sd_tiny/diffusers/tokenizer --out $W/unet --vae-from .carry/demo-vae.safetensors --batch 256 --lr 6e-4 --warmup 200 --cfgs 2,3.5,5,7.5 --ref-cfg auto"
timeout $((500 - $(date +%s) + T0)) python3 tools/demo-model/train.py unet $ARGS --time ${UNET_TIME:-340} --pool 131072 --pool-time 40 --channels-last auto --fused --min-snr 5 $EXTRA || {
  echo "FAILED unet (fast loop) after $(( $(date +%s) - T0 )) s"
  if [ ! -f $W/unet/easel-demo-shapes.safetensors ] && [ $(( $(date +%s) - T0 )) -lt 150 ]; then
    # fallback: the original loop (render + encode every batch), as in runs 2 and 3
    timeout $((500 - $(date +%s) + T0)) python3 tools/demo-model/train.py unet $ARGS --batch 128 --lr 5e-4 --time 230 $EXTRA || echo "FAILED unet (original loop)"
  fi
}
date +%T
sha256sum $W/unet/easel-demo-shapes.safetensors && split -b 15m $W/unet/easel-demo-shapes.safetensors $OUT/model.part
rm -f $W/unet/easel-demo-shapes.safetensors; mkdir -p $W/demo; cp -r $W/unet $W/demo/
tar -C $W -cf $OUT/demo.tar demo
date +%T; echo "total $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/log
