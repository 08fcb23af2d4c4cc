# GPU-machine run 11 (issue 28): a new VAE and text encoder + UNet from scratch, in one 10-minute call.
#
# Why (tools/demo-model/README.md, "Run 11"): the shipped VAE (v1: 32 channels at full resolution, so its last
# GroupNorm has one channel per group and cannot pass a flat colour) makes the speck (one latent cell of extreme
# value) and the frame (border values), and by itself gets the object colour of only 0.66 of the procedural
# pictures right. Run 11: VAE gn3 (96 channels at every level, 1 resnet per level), trained on 128x128 crops then
# 256x256, with an edge term; text encoder w64 (pays for the VAE in the 30 MB file); UNet gn2 (64 channels at the
# 32x32 level); zero-terminal SNR + v-prediction as run 9 but no offset noise; object-weighted loss; other
# phrasings and hard colour pairs in the captions; two EMAs; settings (sampler, CFG) chosen by the scorer and
# written into the file's metadata (easel.*).
#
# Usage (repo root, $OUT set): bash tools/reference/device_call11.sh
#   run tool: timeout_s 600, carry [".carry/diffusers.tar.xz"] (the working tree: tools/, the tokenizer in
#   tests/data/reference/sd_tiny/diffusers/tokenizer; nothing else is read).
# Resume (a second call, text encoder + UNet continued, the VAE kept):
#   RESUME=.carry/run11.safetensors bash tools/reference/device_call11.sh
#   carry [".carry/diffusers.tar.xz", ".carry/run11.safetensors"] (run 11's file, joined from its model.part*).
# Back in $OUT (7 files): model.partaa, model.partab (the .safetensors, split at 15 MiB; the sha256 is in log),
# summary.json, grid.png (the 8 model-card prompts at 256x256, full size), loss-log.csv (VAE and UNet),
# demo.tar (samples/, reference/ (parity references), vae_check.png, vae_config.json), log.
# Environment: END (seconds after the start by which training, export and scoring are done, default 560; the
# UNet stage is killed at END + 15; splitting and packing take ~5 s), VAE_TIME (default 170).
set -o pipefail
T0=$(date +%s)
END=${END:-560}
VAE_TIME=${VAE_TIME:-170}
source tools/reference/device_setup.sh
TOK=tests/data/reference/sd_tiny/diffusers/tokenizer
{
date +%T; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; nproc
python3 -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)"
COMMON="--tok $TOK --out $W/unet --zsnr --offset-noise 0 --obj-weight 2 --phrasings 0.4 --hard-pairs 0.15 --batch auto --lr-scale --pool 65536 --pool-time 25 --channels-last auto --fused --ckpt-every 60 --end-by $((T0 + END)) --reserve 80 --reserve-refs 25"
if [ -z "$RESUME" ]; then
  timeout $((VAE_TIME + 60)) python3 tools/demo-model/train.py vae --vae-arch gn3 --crop 128 --full-frac 0.25 --batch 64 --lr 4e-4 --edge-weight 1 --outlier-weight 0.01 --channels-last auto --fused --out $W/vae --time $VAE_TIME --end-by $((T0 + 45 + VAE_TIME)) --reserve 15 || echo "FAILED vae after $(( $(date +%s) - T0 )) s"
  ARGS="unet --vae $W/vae --arch gn2 --te-arch w64 --lr 6e-4 --warmup 200 --ema 0.995,0.999 $COMMON"
else
  ARGS="unet --resume $RESUME --lr 3e-4 --warmup 50 --ema 0.998,0.9995 $COMMON"
fi
date +%T
timeout $((T0 + END + 15 - $(date +%s))) python3 tools/demo-model/train.py $ARGS --time 560 || echo "FAILED unet after $(( $(date +%s) - T0 )) s"
date +%T
M=$W/unet/easel-demo-shapes.safetensors
[ -f $M ] || { M=$W/unet/checkpoint.safetensors; echo "no final export: the last checkpoint comes back instead"; }
sha256sum $M && split -b 15m $M $OUT/model.part
cp $W/unet/train_summary.json $OUT/summary.json 2>/dev/null || cp $W/vae/vae_config.json $OUT/summary.json
cp $W/unet/samples/grid_full.png $OUT/grid.png 2>/dev/null || cp $W/vae/vae_check.png $OUT/grid.png
{ echo "stage,step,elapsed_s,lr,loss,detail"
  [ -f $W/vae/loss-log-vae.csv ] && tail -n +2 $W/vae/loss-log-vae.csv | awk -F, '{printf "11-vae,%s,%s,%s,%s,l1=%s edge=%s kl=%s outlier=%s zmax=%s px=%s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10}'
  [ -f $W/unet/loss-log-unet.csv ] && tail -n +2 $W/unet/loss-log-unet.csv | awk -F, '{printf "11-unet,%s,%s,%s,%s,smoothed=%s\n", $1, $2, $3, $4, $5}'
} > $OUT/loss-log.csv
mkdir -p $W/demo && cp -r $W/unet/samples $W/unet/reference $W/demo/ 2>/dev/null
cp $W/vae/vae_check.png $W/vae/vae_config.json $W/demo/ 2>/dev/null
tar -C $W -cf $OUT/demo.tar demo
ls -la $OUT; date +%T; echo "total $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/log
