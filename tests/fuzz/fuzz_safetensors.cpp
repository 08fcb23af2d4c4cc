// libFuzzer target: the safetensors reader (see fuzz_common.h).
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return easel::fuzz::run_one(data, size, "fuzz.safetensors");
}
