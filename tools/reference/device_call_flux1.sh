# GPU-machine run for tests/data/reference/flux1_tiny (run tool, carry [".carry/diffusers.tar.xz", ".carry/t5_tokenizer_config.json"]):
# the tiny FLUX.1 dev and schnell pipelines (tools/reference/make_flux_pipeline.py).
# models/tokenizers/t5/tokenizer.json.gz = the T5 tokenizer.json easel embeds (gzip); .carry/t5_tokenizer_config.json =
# a copy of ../shared/models/t5-tokenizer/tokenizer_config.json; the CLIP tokenizer is the tracked
# tests/data/reference/sd_tiny/diffusers/tokenizer.
set -e
source tools/reference/device_setup.sh
python3 tools/reference/make_flux_pipeline.py --clip-tok-dir tests/data/reference/sd_tiny/diffusers/tokenizer \
    --t5-tok-gz models/tokenizers/t5/tokenizer.json.gz --t5-tok-config .carry/t5_tokenizer_config.json \
    --out $W/flux1_tiny
du -sh $W/flux1_tiny
tar -C $W -cf $OUT/flux1_tiny.tar flux1_tiny
