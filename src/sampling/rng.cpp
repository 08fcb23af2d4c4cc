// Random number generators; see rng.h for the sources of every rule followed here.
#include "sampling/rng.h"

#include "core/error.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <numbers>

// The torch-compatible paths below spell out every fused multiply-add with std::fma and
// every unfused operation as a separate statement; the compiler must not contract the rest.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "core/strings.h"

namespace easel::sampling {

RngKind parse_rng_kind(std::string_view name) {
    const std::string s = ascii_lower(name);
    if (s == "cpu") return RngKind::Cpu;
    if (s == "cuda") return RngKind::Cuda;
    if (s == "std_default") return RngKind::StdDefault;
    fail(ErrorKind::InvalidInput, "unknown RNG '{}': use cpu, cuda or std_default", name);
}

const char* rng_kind_name(RngKind kind) {
    switch (kind) {
        case RngKind::Cpu: return "cpu";
        case RngKind::Cuda: return "cuda";
        case RngKind::StdDefault: return "std_default";
    }
    return "?";
}

// ---------------------------------------------------------------------------------------
// MT19937 (Matsumoto & Nishimura 1998), Knuth's initialisation as in at::mt19937.

Mt19937::Mt19937(uint64_t seed) {
    state[0] = static_cast<uint32_t>(seed & 0xffffffffu);
    for (int j = 1; j < kN; ++j)
        state[j] = 1812433253u * (state[j - 1] ^ (state[j - 1] >> 30)) + static_cast<uint32_t>(j);
    index = kN;
}

uint32_t Mt19937::next() {
    constexpr int kM = 397;
    if (index >= static_cast<uint32_t>(kN)) {
        for (int i = 0; i < kN; ++i) {
            uint32_t y = (state[i] & 0x80000000u) | (state[(i + 1) % kN] & 0x7fffffffu);
            uint32_t v = y >> 1;
            if (y & 1u) v ^= 0x9908b0dfu;
            state[i] = state[(i + kM) % kN] ^ v;
        }
        index = 0;
    }
    uint32_t y = state[index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

// ---------------------------------------------------------------------------------------
// Philox4x32-10.

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
    constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k[0] += kW0;
            k[1] += kW1;
        }
        const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
        const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
        const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
        c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    }
    return c;
}

// ---------------------------------------------------------------------------------------
// torch CPU: the Cephes polynomials of avx_mathfun.h, one lane at a time, with the fused
// multiply-adds the x86-64 builds produce (every multiply whose only use is an add/sub).

namespace {

inline float f32(double v) { return static_cast<float>(v); }
inline uint32_t bits(float v) { return std::bit_cast<uint32_t>(v); }
inline float from_bits(uint32_t v) { return std::bit_cast<float>(v); }

// log256_ps for one lane, x in (0, 1].
float cephes_log(float x) {
    x = std::max(x, from_bits(0x00800000u));
    int32_t imm0 = static_cast<int32_t>(bits(x) >> 23);
    x = from_bits((bits(x) & ~0x7f800000u) | bits(0.5f));
    imm0 -= 0x7f;
    float e = static_cast<float>(imm0);
    e = e + 1.0f;
    const bool mask = x < f32(0.707106781186547524);
    const float tmp = mask ? x : 0.0f;
    x = x - 1.0f;
    e = e - (mask ? 1.0f : 0.0f);
    x = x + tmp;
    const float z = x * x;
    float y = f32(7.0376836292E-2);
    y = std::fma(y, x, f32(-1.1514610310E-1));
    y = std::fma(y, x, f32(1.1676998740E-1));
    y = std::fma(y, x, f32(-1.2420140846E-1));
    y = std::fma(y, x, f32(1.4249322787E-1));
    y = std::fma(y, x, f32(-1.6668057665E-1));
    y = std::fma(y, x, f32(2.0000714765E-1));
    y = std::fma(y, x, f32(-2.4999993993E-1));
    y = std::fma(y, x, f32(3.3333331174E-1));
    y = y * x;
    const float eq1 = e * f32(-2.12194440e-4);
    y = std::fma(y, z, eq1);
    y = std::fma(z, -0.5f, y);
    x = x + y;
    x = std::fma(e, f32(0.693359375), x);
    return x;
}

// sincos256_ps for one lane, theta >= 0.
void cephes_sincos(float theta, float& s, float& c) {
    uint32_t sign_sin = bits(theta) & 0x80000000u;
    float x = from_bits(bits(theta) & 0x7fffffffu);
    const float y0 = x * f32(1.27323954473516);
    int32_t j = static_cast<int32_t>(y0);  // cvttps: truncation
    j = (j + 1) & ~1;
    const float yq = static_cast<float>(j);
    const uint32_t swap_sign = static_cast<uint32_t>(j & 4) << 29;
    const bool poly = (j & 2) == 0;
    sign_sin ^= swap_sign;
    const uint32_t sign_cos = static_cast<uint32_t>(~(j - 2) & 4) << 29;
    x = std::fma(yq, f32(-0.78515625), x);
    x = std::fma(yq, f32(-2.4187564849853515625e-4), x);
    x = std::fma(yq, f32(-3.77489497744594108e-8), x);
    const float z = x * x;
    float yc = std::fma(f32(2.443315711809948E-005), z, f32(-1.388731625493765E-003));
    yc = std::fma(yc, z, f32(4.166664568298827E-002));
    yc = yc * z;
    const float half_z = z * 0.5f;
    yc = std::fma(yc, z, -half_z);
    yc = yc + 1.0f;
    float ys = std::fma(f32(-1.9515295891E-4), z, f32(8.3321608736E-3));
    ys = std::fma(ys, z, f32(-1.6666654611E-1));
    ys = ys * z;
    ys = std::fma(ys, x, x);
    const float sv = poly ? ys : yc;
    const float cv = poly ? yc : ys;
    s = from_bits(bits(sv) ^ sign_sin);
    c = from_bits(bits(cv) ^ sign_cos);
}

// normal_fill_16_AVX2 with mean 0, std 1 (its final fmadd(n, 1, 0) is exact).
void normal_fill_16(float* data) {
    const float two_pi = f32(2.0 * std::numbers::pi);
    for (int j = 0; j < 8; ++j) {
        const float u1 = 1.0f - data[j];
        const float u2 = data[j + 8];
        const float radius = std::sqrt(-2.0f * cephes_log(u1));
        const float theta = two_pi * u2;
        float s, c;
        cephes_sincos(theta, s, c);
        data[j] = radius * c;
        data[j + 8] = radius * s;
    }
}

// curand's _curand_box_muller on the device (x, y: two Philox outputs): returns
// {s*sin(v), s*cos(v)}. nvcc contracts the uniform transforms into fmaf; logf is evaluated in
// double and rounded (the GPU's logf is within 1 ulp); __sincosf compiles to FMUL.RZ by
// 1/(2 pi) followed by the MUFU.SIN/COS hardware approximation: the reduction is reproduced
// exactly, the hardware function by the exact sin/cos(2 pi r) rounded to float.
std::array<float, 2> curand_box_muller(uint32_t x, uint32_t y) {
    constexpr float kInv = 0x1p-32f;                 // CURAND_2POW32_INV
    const float kInv2Pi = kInv * 6.2831855f;          // CURAND_2POW32_INV_2PI (exact product)
    const float u = std::fma(static_cast<float>(x), kInv, kInv / 2.0f);
    const float v = std::fma(static_cast<float>(y), kInv2Pi, kInv2Pi / 2.0f);
    const float lg = static_cast<float>(std::log(static_cast<double>(u)));
    const float s = std::sqrt(-2.0f * lg);
    const double prod = static_cast<double>(v) * static_cast<double>(0.15915494f);  // exact
    float r = static_cast<float>(prod);
    if (std::abs(static_cast<double>(r)) > std::abs(prod)) r = std::nextafter(r, 0.0f);  // round toward zero
    const double a = 2.0 * std::numbers::pi * static_cast<double>(r);
    const float sn = static_cast<float>(std::sin(a));
    const float cs = static_cast<float>(std::cos(a));
    return {sn * s, cs * s};
}

}  // namespace

// ---------------------------------------------------------------------------------------

Rng::Rng(RngKind kind, uint64_t seed, int64_t cuda_max_threads)
    : kind_(kind), seed_(seed), mt_(seed), cuda_max_threads_(cuda_max_threads) {
    if (cuda_max_threads < 0)
        fail(ErrorKind::InvalidInput, "cuda_max_threads must be >= 0 (0 = unlimited), got {}",
             cuda_max_threads);
}

float Rng::uniform_float() {
    // transformation::uniform_real<float>: (v & (2^24 - 1)) * 2^-24, in float.
    return static_cast<float>(mt_.next() & 0xFFFFFFu) * 0x1p-24f;
}

double Rng::normal_double() {
    if (has_next_double_) {
        has_next_double_ = false;
        return next_double_;
    }
    auto uniform53 = [this]() {
        const uint64_t hi = mt_.next();
        const uint64_t lo = mt_.next();
        const uint64_t v = (hi << 32) | lo;  // CPUGeneratorImpl::random64
        return static_cast<double>(v & ((uint64_t(1) << 53) - 1)) * 0x1p-53;
    };
    const double u1 = uniform53();
    const double u2 = uniform53();
    const double r = std::sqrt(-2.0 * std::log1p(-u2));
    const double theta = 2.0 * std::numbers::pi * u1;
    next_double_ = r * std::sin(theta);
    has_next_double_ = true;
    return r * std::cos(theta);
}

void Rng::randn_cpu(std::span<float> out) {
    const int64_t n = static_cast<int64_t>(out.size());
    if (n < 16) {
        for (auto& v : out) v = static_cast<float>(normal_double());
        return;
    }
    float* data = out.data();
    for (int64_t i = 0; i < n; ++i) data[i] = uniform_float();
    for (int64_t i = 0; i + 16 <= n; i += 16) normal_fill_16(data + i);
    if (n % 16 != 0) {
        float* tail = data + n - 16;
        for (int i = 0; i < 16; ++i) tail[i] = uniform_float();
        normal_fill_16(tail);
    }
}

void Rng::randn_cuda(std::span<float> out) {
    const uint64_t n = out.size();
    if (n == 0) return;
    constexpr uint64_t kBlock = 256, kUnroll = 4;
    uint64_t threads = (n + kBlock - 1) / kBlock * kBlock;
    if (cuda_max_threads_ > 0) threads = std::min<uint64_t>(threads, static_cast<uint64_t>(cuda_max_threads_));
    const uint64_t stride = threads * kUnroll;
    const uint64_t calls = (n - 1) / stride + 1;  // curand_normal4 calls per thread
    const uint64_t base = philox_offset_ / 4;
    const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
    for (uint64_t k = 0; k < calls; ++k) {
        const uint64_t ctr = base + k;
        for (uint64_t idx = 0; idx < threads; ++idx) {
            const uint64_t first = idx + k * stride;
            if (first >= n) break;
            const auto r = philox4x32_10({static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32),
                                          static_cast<uint32_t>(idx), static_cast<uint32_t>(idx >> 32)},
                                         key);
            const auto a = curand_box_muller(r[0], r[1]);
            float v4[4] = {a[0], a[1], 0.0f, 0.0f};
            if (first + 2 * threads < n) {
                const auto b = curand_box_muller(r[2], r[3]);
                v4[2] = b[0];
                v4[3] = b[1];
            }
            for (uint64_t ii = 0; ii < kUnroll; ++ii) {
                const uint64_t li = first + ii * threads;
                if (li < n) out[li] = v4[ii];
            }
        }
    }
    philox_offset_ += calls * 4;
}

std::vector<float> Rng::randn(int64_t n) {
    if (n < 0) fail(ErrorKind::InvalidInput, "randn: element count must be >= 0, got {}", n);
    std::vector<float> out(static_cast<size_t>(n));
    switch (kind_) {
        case RngKind::Cpu: randn_cpu(out); break;
        case RngKind::Cuda: randn_cuda(out); break;
        case RngKind::StdDefault:
            for (auto& v : out) v = static_cast<float>(normal_double());
            break;
    }
    return out;
}

// Layout: [version, kind, seed, mt index, 624 mt words, has_next_double, next_double bits,
//          philox_offset, cuda_max_threads].
namespace {
constexpr int64_t kRngStateVersion = 1;
constexpr size_t kRngStateLen = 4 + Mt19937::kN + 4;
}  // namespace

std::vector<int64_t> Rng::save() const {
    std::vector<int64_t> w;
    w.reserve(kRngStateLen);
    w.push_back(kRngStateVersion);
    w.push_back(static_cast<int64_t>(kind_));
    w.push_back(std::bit_cast<int64_t>(seed_));
    w.push_back(mt_.index);
    for (uint32_t s : mt_.state) w.push_back(s);
    w.push_back(has_next_double_ ? 1 : 0);
    w.push_back(std::bit_cast<int64_t>(next_double_));
    w.push_back(static_cast<int64_t>(philox_offset_));
    w.push_back(cuda_max_threads_);
    return w;
}

Rng Rng::restore(std::span<const int64_t> w) {
    if (w.size() != kRngStateLen || w[0] != kRngStateVersion)
        fail(ErrorKind::InvalidInput,
             "RNG state has {} words (version {}), expected {} words of version {}: the checkpoint "
             "was written by another easel version or is damaged",
             w.size(), w.empty() ? -1 : w[0], kRngStateLen, kRngStateVersion);
    if (w[1] < 0 || w[1] > 2) fail(ErrorKind::InvalidInput, "RNG state names unknown kind {}", w[1]);
    if (w[3] < 0 || w[3] > Mt19937::kN) fail(ErrorKind::InvalidInput, "RNG state has bad MT index {}", w[3]);
    Rng r(static_cast<RngKind>(w[1]), std::bit_cast<uint64_t>(w[2]), std::max<int64_t>(0, w[kRngStateLen - 1]));
    r.mt_.index = static_cast<uint32_t>(w[3]);
    for (int i = 0; i < Mt19937::kN; ++i) r.mt_.state[i] = static_cast<uint32_t>(w[4 + i]);
    size_t p = 4 + Mt19937::kN;
    r.has_next_double_ = w[p++] != 0;
    r.next_double_ = std::bit_cast<double>(w[p++]);
    r.philox_offset_ = static_cast<uint64_t>(w[p++]);
    return r;
}

}  // namespace easel::sampling
