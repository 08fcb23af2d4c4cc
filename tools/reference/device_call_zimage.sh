# GPU-machine run for tests/data/reference/zimage_tiny (run tool, carry [".carry/diffusers.tar.xz", ".carry/qwen3_tokenizer_config.json"]): the tiny Z-Image pipeline.
# models/tokenizers/qwen3/tokenizer.json.gz = the Qwen3 tokenizer.json easel embeds (gzip),
# .carry/qwen3_tokenizer_config.json = a copy of its tokenizer_config.json.
set -e
source tools/reference/device_setup.sh
python3 tools/reference/make_zimage_pipeline.py --tok-gz models/tokenizers/qwen3/tokenizer.json.gz \
    --tok-config .carry/qwen3_tokenizer_config.json --out $W/zimage_tiny
tar -C $W -cf $OUT/zimage_tiny.tar zimage_tiny
