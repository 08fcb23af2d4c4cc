// Random number generators for initial latent noise and ancestral sampler noise.
//
// Three kinds (names as sd-cli's --rng accepts them, plus `cpu`):
//   cpu          PyTorch CPU torch.randn for a seed, bit for bit: at::mt19937 seeded with the
//                seed; for a float32 tensor of numel >= 16 torch's normal_fill_AVX2 (uniforms
//                first, then Box-Muller 16 at a time over pairs (j, j+8) with avx_mathfun's
//                Cephes log/sincos polynomials, FMA-contracted as in the x86-64 wheels; a
//                numel % 16 tail is redrawn and recomputed); for numel < 16 the scalar
//                normal_distribution<double> path with its cached second value.
//                Sources: aten/src/ATen/native/cpu/DistributionTemplates.h,
//                aten/src/ATen/native/cpu/avx_mathfun.h, aten/src/ATen/core/DistributionsHelper.h,
//                aten/src/ATen/core/TransformationHelper.h, aten/src/ATen/CPUGeneratorImpl.cpp.
//   cuda         PyTorch CUDA torch.randn (what A1111 and sd.cpp call "cuda"/"GPU" noise):
//                Philox4x32-10 keyed with the seed, thread i of the launch uses subsequence i and
//                counter offset = 4 * (number of earlier randn calls), curand_normal4 layout.
//                Sources: aten/src/ATen/native/cuda/DistributionTemplates.h (grid-stride loop,
//                unroll 4), curand_philox4x32_x.h / curand_normal.h facts, A1111 rng_philox.py.
//                The GPU computes sin/cos with the __sincosf hardware approximation (FMUL.RZ by
//                1/(2 pi), then MUFU.SIN/COS), which no CPU code reproduces bit for bit: values
//                agree with torch on an H200 to 1.07e-6 (max abs, 13077 values); the Philox
//                stream, offsets and element layout are exact.
//   std_default  easel's own portable generator: at::mt19937 + Box-Muller on 53-bit doubles
//                (the element-wise normal_distribution<double> rule of torch's scalar path),
//                identical on every platform and standard library.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace easel::sampling {

/// Which generator an Rng runs.
enum class RngKind { Cpu, Cuda, StdDefault };

/// Parses "cpu", "cuda", "std_default" (case-insensitive). Throws Error(InvalidInput) otherwise.
RngKind parse_rng_kind(std::string_view name);
/// The name parse_rng_kind accepts for kind.
const char* rng_kind_name(RngKind kind);

/// The 32-bit Mersenne Twister exactly as PyTorch's at::mt19937 (= std::mt19937 output; Knuth
/// initialisation from the low 32 bits of the seed). State is public for serialisation.
struct Mt19937 {
    static constexpr int kN = 624;
    std::array<uint32_t, kN> state{};
    uint32_t index = kN;  ///< next word to temper; kN means "twist before the next output"

    explicit Mt19937(uint64_t seed = 5489);
    uint32_t next();
};

/// Philox4x32-10 block function (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
/// SC'11; curand's constants): 10 rounds over the 128-bit counter ctr with key {k0, k1}.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key);

/// A seeded normal generator with a serialisable state. Each randn(n) call is one
/// torch.randn(shape) call with numel n on the same generator (the state advances).
class Rng {
public:
    /// cuda_max_threads: for kind Cuda, the number of GPU threads PyTorch launches at most
    /// (blocks of 256; SMs * maxThreadsPerSM / 256 blocks, e.g. 132*8*256 = 270336 on an
    /// H100/H200). 0 = unlimited, one element per thread, as A1111's and sd.cpp's CPU ports
    /// assume; the two agree for every numel <= the GPU's limit.
    Rng(RngKind kind, uint64_t seed, int64_t cuda_max_threads = 0);

    RngKind kind() const { return kind_; }
    uint64_t seed() const { return seed_; }

    /// n standard-normal float32 values (one torch.randn call with numel n). Throws
    /// Error(InvalidInput) for n < 0.
    std::vector<float> randn(int64_t n);

    /// Serialised state: a flat int64 vector (kind, seed, generator words, cached values).
    std::vector<int64_t> save() const;
    /// Rebuilds an Rng from save()'s output. Throws Error(InvalidInput) if malformed.
    static Rng restore(std::span<const int64_t> words);

private:
    RngKind kind_;
    uint64_t seed_;
    Mt19937 mt_;
    // torch CPUGeneratorImpl's cached second Box-Muller value (next_double_normal_sample).
    bool has_next_double_ = false;
    double next_double_ = 0.0;
    // cuda: philox_offset_per_thread (a multiple of 4) and the launch limit.
    uint64_t philox_offset_ = 0;
    int64_t cuda_max_threads_ = 0;

    double normal_double();  // torch at::normal_distribution<double>(0, 1)
    float uniform_float();   // torch at::uniform_real_distribution<float>(0, 1)
    void randn_cpu(std::span<float> out);
    void randn_cuda(std::span<float> out);
};

}  // namespace easel::sampling
