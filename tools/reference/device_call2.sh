# GPU-machine run 2: tiny SD pipeline references (re-run), VAE fine-tuning continued from run 1
# (.carry/vae/vae.safetensors), then text encoder + UNet training, export and samples.
# Usage (repo root, $OUT set): bash tools/reference/device_call2.sh
set -o pipefail
source tools/reference/device_setup.sh
{
date +%T; python3 tools/reference/dump_clip_tokens.py --gz $GZ --tok-dir $W/tok --out $W/clip_tokenizer_cases.json --meta-out $W/clip_meta.json || echo "FAILED tokens"
date +%T; timeout 120 python3 tools/reference/make_sd_pipeline.py --gz $GZ --out $W/sd_tiny || echo "FAILED sd pipeline"
rm -rf $W/sd_tiny/_tok; cp $W/clip_meta.json $W/sd_tiny/
tar -C $W -cf - sd_tiny | split -b 15m - $OUT/sd_tiny.tar.part || echo "FAILED tar"
mkdir -p $W/demo; python3 tools/demo-model/train.py preview --out $W/demo || echo "FAILED preview"
date +%T; timeout 150 python3 tools/demo-model/train.py vae --init .carry/vae --out $W/vae --time ${VAE_TIME:-75} --lr 2e-4 --est-steps ${VAE_EST:-650} || echo "FAILED vae"
cp $W/vae/loss-log-vae.csv $W/demo/loss-log-vae-2.csv; cp $W/vae/vae_config.json $W/demo/vae2_config.json
date +%T; timeout 480 python3 tools/demo-model/train.py unet --vae $W/vae --tok $W/tok --out $W/unet --time ${UNET_TIME:-320} --est-steps ${UNET_EST:-4500} || echo "FAILED unet"
split -b 15m $W/unet/easel-demo-shapes.safetensors $OUT/model.part; sha256sum $W/unet/easel-demo-shapes.safetensors
rm -f $W/unet/easel-demo-shapes.safetensors; cp -r $W/unet $W/demo/
tar -C $W -cf $OUT/demo.tar demo
date +%T
} 2>&1 | tee $OUT/log
