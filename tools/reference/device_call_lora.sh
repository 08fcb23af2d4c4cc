# GPU-machine run for tests/data/reference/lora (issue 21): LoRA + textual-inversion references on the
# tiny pipelines (tools/reference/make_lora_refs.py). diffusers' source: .diffusers/ (carried as is) or
# .carry/diffusers.tar.xz (unpacked by device_setup.sh). Outputs in $OUT/lora (< 3 MB): copy them to
# tests/data/reference/lora/.
set -e
if [ -f .carry/diffusers.tar.xz ]; then
  source tools/reference/device_setup.sh
else
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
fi
python3 tools/reference/make_lora_refs.py --out $OUT/lora
du -ab $OUT/lora | sort -n | tail -12
