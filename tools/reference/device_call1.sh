# GPU-machine run 1: reference data (randn, CLIP tokens, tiny SD pipeline), the demo VAE, and a short
# smoke run of the demo UNet stage. Usage (repo root, $OUT set): bash tools/reference/device_call1.sh
set -o pipefail
source tools/reference/device_setup.sh
{
nvidia-smi -L; python3 -c "import torch, transformers, diffusers; print(torch.__version__, transformers.__version__, diffusers.__version__)"
date +%T; python3 tools/reference/dump_randn.py --out $OUT/torch_randn.json || echo "FAILED randn"
date +%T; python3 tools/reference/dump_clip_tokens.py --gz $GZ --tok-dir $W/tok --out $OUT/clip_tokenizer_cases.json --meta-out $W/clip_meta.json || echo "FAILED tokens"
date +%T; python3 tools/reference/make_sd_pipeline.py --gz $GZ --out $W/sd_tiny || echo "FAILED sd pipeline"
cp $W/clip_meta.json $W/sd_tiny/ 2>/dev/null
tar -C $W -cf - sd_tiny | split -b 15m - $OUT/sd_tiny.tar.part || echo "FAILED tar"
date +%T; timeout 260 python3 tools/demo-model/train.py vae --out $W/vae --time ${VAE_TIME:-170} || echo "FAILED vae"
tar -C $W -cf $OUT/vae.tar vae
date +%T; timeout 150 python3 tools/demo-model/train.py unet --vae $W/vae --tok $W/tok --out $W/smoke --time 20 --est-steps 300 || echo "FAILED unet smoke"
rm -f $W/smoke/easel-demo-shapes.safetensors
tar -C $W -cf $OUT/smoke.tar smoke
date +%T
} 2>&1 | tee $OUT/log
