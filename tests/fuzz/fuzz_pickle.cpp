// libFuzzer target: the restricted unpickler alone (io/pickle.h) on raw pickle bytes, then the
// state-dict search over what it built. A malformed or hostile pickle must raise easel::Error,
// nothing else (no crash, no leak, no unbounded recursion). Seeds: tests/fuzz/corpus/pytorch/*.pkl.
#include "core/error.h"
#include "io/pickle.h"

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto u = easel::io::pickle::unpickle(std::span<const uint8_t>(data, size), "fuzz.pkl");
        (void)easel::io::pickle::select_state_dict(u, "fuzz.pkl");
    } catch (const easel::Error&) {
    }
    return 0;
}
