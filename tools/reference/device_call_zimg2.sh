# GPU-machine run (run tool, repo root, $OUT set): only the tiny SD2.x v-prediction pipeline
# (tests/data/reference/sd2_tiny), with a diffusers folder that keeps only its
# JSON files (tests rebuild its weights from the single file). Carry: [".carry/diffusers.tar.xz",
# ".carry/bpe_simple_vocab_16e6.txt.gz"]. Writes $OUT/sd2_tiny.tar (~9 MB), $OUT/log.
set -o pipefail
source tools/reference/device_setup.sh
{
date +%T; timeout 240 python3 tools/reference/make_sd2_pipeline.py --gz .carry/bpe_simple_vocab_16e6.txt.gz \
    --out $W/sd2_tiny --configs-only-folder || echo "FAILED sd2 pipeline"
rm -rf $W/sd2_tiny/_tok
tar -C $W -cf $OUT/sd2_tiny.tar sd2_tiny || echo "FAILED sd2 tar"
date +%T; du -sh $W/sd2_tiny; find $W/sd2_tiny -type f | xargs ls -la
} 2>&1 | tee $OUT/log
