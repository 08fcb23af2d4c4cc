// The `easel` command's subcommands. Each source file in apps/cli registers its subcommands
// with EASEL_COMMAND; main() builds the CLI11 app from the registry.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <ggml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace easel::cli {

/// One subcommand: setup() adds its options to `sub` and returns the function run when the
/// subcommand is chosen (returning the process exit code).
struct Command {
    std::string name;
    std::string help;
    std::function<std::function<int()>(CLI::App& sub)> setup;
    int order = 100;  ///< position in --help
};

std::vector<Command>& registry();

struct Registrar {
    explicit Registrar(Command c) { registry().push_back(std::move(c)); }
};

/// Options every command accepts that change global state (-v, --color, --rpc-servers).
struct CommonOptions {
    bool verbose = false;
    bool color = false;
    std::string rpc_servers;
};
/// Adds -v/--verbose, --color and --rpc-servers to `app`.
void add_common_options(CLI::App& app, CommonOptions& o);
/// Applies them (log level, colour, RPC registration). Throws easel::Error.
void apply_common_options(const CommonOptions& o);

/// CLI11 check of a numeric option with a range: a value that is not a number is refused as
/// such ("abc is not a number: pass a whole number from 1 to 10000"), not as "not in range"
/// (CLI::Range's words for it); a number outside [lo, hi] names the range. `whole`: integers only.
/// Runs at parse time.
inline CLI::Validator number_check(double lo, double hi, bool whole) {
    const std::string what = whole ? "a whole number" : "a number";
    const std::string range = fmt::format("{} from {} to {}", what, lo, hi);
    return CLI::Validator(
        [what, range, lo, hi, whole](std::string& s) -> std::string {
            errno = 0;
            char* end = nullptr;
            const double v = whole ? (double)std::strtoll(s.c_str(), &end, 10) : std::strtod(s.c_str(), &end);
            if (s.empty() || end == s.c_str() || *end != '\0' || (!whole && !std::isfinite(v))) return s + " is not " + what + ": pass " + range;
            if (errno == ERANGE || v < lo || v > hi) return s + " is outside the range: pass " + range;
            return {};
        },
        fmt::format("{} in [{}, {}]", whole ? "INT" : "FLOAT", lo, hi), "number range");
}

/// A CLI11 validator refusing an integer option value above `limit` with the message
/// "VALUE<above>LIMIT<fix>" (also a value too large for long long); values that are not integers
/// are left to CLI11's conversion error. `name` is the validator's name in CLI11's help.
inline CLI::Validator max_integer_check(long long limit, std::string above, std::string fix, std::string name) {
    return CLI::Validator(
        [limit, above, fix](std::string& s) -> std::string {
            errno = 0;
            char* end = nullptr;
            long long v = std::strtoll(s.c_str(), &end, 10);
            if (end == s.c_str() || *end != '\0') return {};
            if (errno == ERANGE || v > limit) return s + above + std::to_string(limit) + fix;
            return {};
        },
        "", std::move(name));
}

/// CLI11 check of -t/--threads (generate, the stage commands, plan, rpc-server): refuses a
/// count above GGML_MAX_N_THREADS (ggml.h, 512), the size of ggml's fixed per-threadpool arrays;
/// above it ggml_graph_compute segfaults (100000) or hangs (4096). Runs at parse time, before any
/// model is opened. Values that are not integers are left to CLI11's conversion error.
inline CLI::Validator max_threads_check() {
    return max_integer_check(GGML_MAX_N_THREADS, " is above ggml's maximum of ", ": pass at most the number of CPU threads", "max threads");
}

}  // namespace easel::cli

#define EASEL_CLI_CAT2(a, b) a##b
#define EASEL_CLI_CAT(a, b) EASEL_CLI_CAT2(a, b)
#define EASEL_COMMAND(...) static ::easel::cli::Registrar EASEL_CLI_CAT(easel_cmd_, __LINE__){::easel::cli::Command{__VA_ARGS__}}
