// libFuzzer target: PyTorch checkpoints through WeightIndex (zip or legacy container, the
// restricted unpickler, tensor extents; see fuzz_common.h). Seeds: tests/fuzz/corpus/pytorch.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return easel::fuzz::run_one(data, size, "fuzz.pth");
}
