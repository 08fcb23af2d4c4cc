// libFuzzer target: the safetensors reader (io/weight_index.h, io/detect.h; see fuzz_common.h).
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return easel::fuzz::run_weight_file(data, size, "fuzz.safetensors");
}
