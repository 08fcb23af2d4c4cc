# GPU-machine run for tests/data/reference/zimage_tiny (run tool, carry [".carry"]): the tiny Z-Image pipeline.
# .carry/qwen3_tokenizer.json.gz = gzip -9 of ../shared/models/qwen3-tokenizer/tokenizer.json,
# .carry/qwen3_tokenizer_config.json = a copy of its tokenizer_config.json.
set -e
source tools/reference/device_setup.sh
python3 tools/reference/make_zimage_pipeline.py --tok-gz .carry/qwen3_tokenizer.json.gz \
    --tok-config .carry/qwen3_tokenizer_config.json --out $W/zimage_tiny
tar -C $W -cf $OUT/zimage_tiny.tar zimage_tiny
