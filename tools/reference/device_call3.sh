# GPU-machine run 3: tiny SD pipeline references again (text-encoder key fix) and more UNet + text
# encoder training, resumed from run 2's export (.carry/demo-stage1.safetensors).
# Usage (repo root, $OUT set): bash tools/reference/device_call3.sh
set -o pipefail
source tools/reference/device_setup.sh
{
date +%T; python3 tools/reference/dump_clip_tokens.py --gz $GZ --tok-dir $W/tok --out $W/clip_tokenizer_cases.json --meta-out $W/clip_meta.json || echo "FAILED tokens"
date +%T; timeout 90 python3 tools/reference/make_sd_pipeline.py --gz $GZ --out $W/sd_tiny || echo "FAILED sd pipeline"
rm -rf $W/sd_tiny/_tok; cp $W/clip_meta.json $W/sd_tiny/
tar -C $W -cf - sd_tiny | split -b 15m - $OUT/sd_tiny.tar.part || echo "FAILED tar"
date +%T; timeout 270 python3 tools/demo-model/train.py unet --resume .carry/demo-stage1.safetensors --tok $W/tok --out $W/unet --time ${UNET_TIME:-160} --lr 3e-4 --warmup 50 || echo "FAILED unet"
split -b 15m $W/unet/easel-demo-shapes.safetensors $OUT/model.part; sha256sum $W/unet/easel-demo-shapes.safetensors
rm -f $W/unet/easel-demo-shapes.safetensors; mkdir -p $W/demo; cp -r $W/unet $W/demo/
tar -C $W -cf $OUT/demo.tar demo
date +%T
} 2>&1 | tee $OUT/log
