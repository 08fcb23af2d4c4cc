# GPU-machine run (run tool, repo root, $OUT set): the tiny SD2.x v-prediction pipeline
# (tests/data/reference/sd2_tiny) and the tiny Z-Image pipeline with its img2img cases
# (tests/data/reference/zimage_tiny). Carry: [".carry/diffusers.tar.xz", ".carry/bpe_simple_vocab_16e6.txt.gz",
# ".carry/qwen3_tokenizer_config.json"]. Writes $OUT/sd2_tiny.tar, $OUT/zimage_tiny.tar, $OUT/log.
set -o pipefail
source tools/reference/device_setup.sh
{
python3 -c "import torch, transformers, diffusers; print(torch.__version__, transformers.__version__, diffusers.__version__)"
date +%T; timeout 240 python3 tools/reference/make_sd2_pipeline.py --gz .carry/bpe_simple_vocab_16e6.txt.gz \
    --out $W/sd2_tiny --configs-only-folder || echo "FAILED sd2 pipeline"
rm -rf $W/sd2_tiny/_tok
tar -C $W -cf $OUT/sd2_tiny.tar sd2_tiny || echo "FAILED sd2 tar"
date +%T; timeout 300 python3 tools/reference/make_zimage_pipeline.py --tok-gz models/tokenizers/qwen3/tokenizer.json.gz \
    --tok-config .carry/qwen3_tokenizer_config.json --out $W/zimage_tiny || echo "FAILED zimage pipeline"
tar -C $W -cf $OUT/zimage_tiny.tar zimage_tiny || echo "FAILED zimage tar"
date +%T; du -sh $W/sd2_tiny $W/zimage_tiny
} 2>&1 | tee $OUT/log
