# GPU-machine run for tests/data/reference/klein_tiny (run tool, carry [".carry/diffusers.tar.xz",
# ".carry/qwen3_tokenizer_config.json"]): the tiny FLUX.2 [klein] pipeline and the TAEF2 PSNR reference.
# models/tokenizers/qwen3/tokenizer.json.gz = the Qwen3 tokenizer.json easel embeds (gzip),
# .carry/qwen3_tokenizer_config.json = a copy of its tokenizer_config.json; the TAEF2 weights are the
# repository's tests/data/reference/autoencoder_tiny_taef2_{encoder,decoder}.safetensors.
set -e
source tools/reference/device_setup.sh
python3 tools/reference/make_klein_pipeline.py --tok-gz models/tokenizers/qwen3/tokenizer.json.gz \
    --tok-config .carry/qwen3_tokenizer_config.json --taef2-dir tests/data/reference --out $W/klein_tiny
du -ab $W/klein_tiny | sort -n | tail -8
tar -C $W -cf $OUT/klein_tiny.tar klein_tiny
