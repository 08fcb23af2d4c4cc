// libFuzzer target: the GGUF reader (ggml's gguf parser plus easel's checks; see fuzz_common.h).
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    return easel::fuzz::run_weight_file(data, size, "fuzz.gguf");
}
