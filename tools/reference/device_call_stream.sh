# GPU-machine run for issue 5 (run tool, kind nvidia-h200, carry [".devcuda"], timeout_s 600):
# streamed vs resident step time of the full-size SD1.5 UNet (bench/placement_bench.cpp) with the
# upload ring (docs/placement.md "Upload ring"). .devcuda/build.sh builds build-cuda (CUDA, sm_90,
# benches) and runs the placement tests; then the bench at 512 and 1024: resident, streamed under
# the smallest budget (2 slots), and every block streamed through rings of 3..12 slots; once more
# at 512 with ggml's CUDA graphs off, to see how much of the streamed overhead they hide.
set -e
FILTER='PlacementStream.*:PlacementRunner.*:PlacementDisk.*:PlacementPlan.*' TEST_TIME=200 bash .devcuda/build.sh
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
mkdir -p /tmp/w
D=$(date -u +%F)
./build-cuda/bench/easel-bench-placement --device CUDA0 --sizes 512,1024 --ring 3,4,6,8,12 --warmup 3 --reps 10 --tmp-dir /tmp/w \
    --json $OUT/$D-h200-placement-sd15-ring.json 2>&1 | tee $OUT/bench.log
GGML_CUDA_DISABLE_GRAPHS=1 ./build-cuda/bench/easel-bench-placement --device CUDA0 --sizes 512 --ring 8 --warmup 3 --reps 10 --tmp-dir /tmp/w \
    --json $OUT/$D-h200-placement-sd15-ring-nographs.json 2>&1 | tee $OUT/bench_nographs.log
