// Helpers shared by the easel-bench programs: timing, medians, output statistics, UTC time
// stamps and self-removing temporary files (for the made-up weight files).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

namespace easel::bench {

using Clock = std::chrono::steady_clock;

/// Seconds elapsed since t0.
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Median of v (mean of the two middle values for an even count); 0 for an empty v.
inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Summary of an output tensor: element count, non-finite count, and mean, standard deviation,
/// min and max of the finite values (a benchmark of a graph that overflowed times the wrong thing).
inline nlohmann::json output_stats(const std::vector<float>& d) {
    int64_t bad = 0, n = 0;
    double s = 0, s2 = 0;
    float lo = INFINITY, hi = -INFINITY;
    for (float x : d) {
        if (!std::isfinite(x)) {
            ++bad;
            continue;
        }
        ++n;
        s += x;
        s2 += (double)x * x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    const double mean = n ? s / n : 0, var = n ? std::max(0.0, s2 / n - mean * mean) : 0;
    return {{"numel", (int64_t)d.size()}, {"non_finite", bad}, {"mean", mean}, {"std", std::sqrt(var)},
            {"min", n ? lo : 0.0f}, {"max", n ? hi : 0.0f}};
}

/// The current UTC time, ISO 8601 ("2026-11-29T20:33:00Z").
inline std::string utc_now() {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char b[32];
    std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return b;
}

/// A temporary file removed when this goes out of scope.
struct TempFile {
    std::filesystem::path path;
    ~TempFile() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove(path, ec);
    }
};

}  // namespace easel::bench
