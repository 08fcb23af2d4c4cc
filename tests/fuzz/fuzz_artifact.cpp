// libFuzzer target: easel's artifacts (pipeline/artifact.h: conditioning, latent and checkpoint
// files) and the sampler state a checkpoint carries (sampling/sampler.h SamplerState::from_map).
// First byte (mode):
//   even: the rest is a file: parse_artifact as each kind; what parses is serialised again and
//         must parse to the same artifact;
//   odd:  the rest describes an artifact (tensors: name, dtype, shape, bytes; metadata): it is
//         written with serialize_artifact and must read back equal, then its "state.*" tensors go
//         through SamplerState::from_map as a checkpoint's do (past the content hash, which
//         random bytes in a file never match).
#include "fuzz_common.h"

#include "pipeline/artifact.h"
#include "sampling/sampler.h"

#include <algorithm>
#include <cstring>

using namespace easel;
using namespace easel::pipeline;

namespace {

bool same(const Artifact& a, const Artifact& b) {
    if (a.kind != b.kind || a.tensors.size() != b.tensors.size()) return false;
    for (size_t i = 0; i < a.tensors.size(); ++i) {
        const auto &x = a.tensors[i], &y = b.tensors[i];
        if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.bytes != y.bytes) return false;
    }
    for (auto& [k, v] : a.meta) {
        auto it = b.meta.find(k);
        if (it == b.meta.end() || it->second != v) return false;
    }
    return true;
}

void sampler_state(const Artifact& a) {
    sampling::StateMap m;
    for (auto& t : a.tensors) {
        if (t.name.rfind("state.", 0) != 0) continue;
        const std::string key = t.name.substr(6);
        if (t.dtype == "F32") m[key] = a.f32(t.name);
        else if (t.dtype == "I64") m[key] = a.i64(t.name);
        else if (t.dtype == "U8") m[key] = a.u8(t.name);
    }
    try {
        auto st = sampling::SamplerState::from_map(m);
        // a state that validates serialises back to the same map
        EASEL_FUZZ_CHECK(sampling::SamplerState::from_map(st.to_map()).to_map() == st.to_map());
    } catch (const Error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz::silence_ggml();
    fuzz::Reader r{data, size};
    const uint8_t mode = r.byte();
    if (mode % 2 == 0) {
        const std::span<const uint8_t> bytes((const uint8_t*)r.p, r.n);
        for (ArtifactKind k : {ArtifactKind::Conditioning, ArtifactKind::Latent, ArtifactKind::Checkpoint}) {
            try {
                Artifact a = parse_artifact(bytes, k, "fuzz");
                const auto again = serialize_artifact(a);
                EASEL_FUZZ_CHECK(same(parse_artifact(again, k, "fuzz (written again)"), a));
                if (k == ArtifactKind::Checkpoint) sampler_state(a);
            } catch (const Error&) {
            }
        }
        return 0;
    }
    Artifact a;
    a.kind = (ArtifactKind)((mode >> 1) % 3);
    const int n_tensors = r.byte() % 16;
    static const char* kDtypes[] = {"F32", "I64", "I32", "U8"};
    static const size_t kSizes[] = {4, 8, 4, 1};
    for (int i = 0; i < n_tensors && r.n; ++i) {
        ArtifactTensor t;
        t.name = r.str();
        if (r.byte() & 1) t.name = "state." + t.name;
        const int d = r.byte() % 4;
        t.dtype = kDtypes[d];
        const int dims = r.byte() % 4;
        int64_t numel = 1;
        for (int k = 0; k < dims; ++k) {
            t.shape.push_back(r.byte() % 8);
            numel *= t.shape.back();
        }
        const size_t nb = (size_t)numel * kSizes[d];
        for (size_t k = 0; k < nb; ++k) t.bytes.push_back(r.byte());
        a.tensors.push_back(std::move(t));
    }
    const int n_meta = r.byte() % 4;
    for (int i = 0; i < n_meta; ++i) {
        std::string k = r.str();
        a.meta[k] = r.str();
    }
    try {
        const auto bytes = serialize_artifact(a);
        Artifact b = parse_artifact(bytes, a.kind, "fuzz");
        // (files hold the tensors in name order)
        std::stable_sort(a.tensors.begin(), a.tensors.end(), [](const auto& x, const auto& y) { return x.name < y.name; });
        EASEL_FUZZ_CHECK(b.tensors.size() == a.tensors.size());
        for (size_t i = 0; i < a.tensors.size(); ++i) {
            EASEL_FUZZ_CHECK(b.tensors[i].dtype == a.tensors[i].dtype);
            EASEL_FUZZ_CHECK(b.tensors[i].shape == a.tensors[i].shape);
            EASEL_FUZZ_CHECK(b.tensors[i].bytes == a.tensors[i].bytes);
        }
        sampler_state(b);
    } catch (const Error&) {
    }
    return 0;
}
