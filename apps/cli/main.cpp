// easel: command-line entry point. `easel <command> [options]`; see `easel --help`.
#include "command.h"

#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "easel_version.h"
#include "placement/devices.h"

#include <algorithm>
#include <csignal>
#include <set>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace easel::cli {

std::vector<Command>& registry() {
    static std::vector<Command> r;
    return r;
}

void add_common_options(CLI::App& app, CommonOptions& o) {
    app.add_flag("-v,--verbose", o.verbose, "Print debug messages");
    app.add_flag("--color", o.color, "Colour warnings and errors");
    app.add_option("--rpc-servers", o.rpc_servers,
                   "Comma-separated host:port list of `easel rpc-server` processes; their devices appear as RPC0, RPC1, ...");
}

void apply_common_options(const CommonOptions& o) {
    if (o.verbose) log::set_level(log::Level::Debug);
    log::set_color(o.color);
    if (!o.rpc_servers.empty()) placement::add_rpc_servers(o.rpc_servers);
}

}  // namespace easel::cli

namespace {

/// ggml's allocation-failure lines ("ggml_aligned_malloc: insufficient memory ...", "...: failed
/// to allocate buffer of size N"), held back instead of printed: each such failure ends as an
/// easel error that says what did not fit and what to change, and the ggml lines would only
/// precede it as noise. They are printed after all when the command ends without an error (and
/// at once with -v).
std::string& held_ggml_lines() {
    static std::string s;
    return s;
}

bool is_allocation_noise(const char* text) {
    return std::strstr(text, "failed to allocate") || std::strstr(text, "insufficient memory") ||
           std::strstr(text, "unable to allocate");
}

void quiet_ggml_log(enum ggml_log_level level, const char* text, void*) {
    const bool debug = easel::log::level() <= easel::log::Level::Debug;
    if (level >= GGML_LOG_LEVEL_WARN && !debug && text && is_allocation_noise(text)) {
        held_ggml_lines() += text;
        return;
    }
    if (level >= GGML_LOG_LEVEL_WARN || debug) std::fputs(text, stderr);
}

/// Prints the held ggml lines when the command ends, unless an easel error reported the failure
/// (dismiss()).
struct HeldGgmlLines {
    bool dismissed = false;
    void dismiss() {
        dismissed = true;
        held_ggml_lines().clear();
    }
    ~HeldGgmlLines() {
        if (!dismissed && !held_ggml_lines().empty()) std::fputs(held_ggml_lines().c_str(), stderr);
    }
};

/// ggml aborts (GGML_ABORT / GGML_ASSERT) end the process: a remote RPC server that dies or
/// answers garbage ends up here (ggml-rpc.cpp), and so does a failed assertion inside ggml.
/// One line instead of a backtrace, then a non-zero exit; outputs and checkpoints are written
/// through a temporary file and a rename, so nothing half-written is left.
void ggml_abort_line(const char* message) {
    std::string m = message ? message : "ggml aborted";
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    for (auto& c : m)
        if (c == '\n') c = ' ';
    const bool rpc = m.find("ggml-rpc") != std::string::npos || m.find("RPC server") != std::string::npos;
    std::fprintf(stderr, "error: %s%s\n", m.c_str(),
                 rpc ? " (an --rpc-servers server stopped or is not an easel/ggml rpc-server; restart it and run again)"
                     : " (inside ggml: please report it with the command line)");
    std::fflush(stderr);
    std::_Exit(1);
}

}  // namespace

int main(int argc, char** argv) {
    using namespace easel;
    platform::init_console();
    ggml_log_set(quiet_ggml_log, nullptr);
    ggml_set_abort_callback(ggml_abort_line);
#ifndef _WIN32
    // A write to a socket whose peer went away (an --rpc-servers server that died, a killed
    // client of `easel rpc-server`) must fail with EPIPE, which ggml's RPC code reports, instead
    // of SIGPIPE ending the process without a word (exit 141).
    std::signal(SIGPIPE, SIG_IGN);
#endif

    CLI::App app{"easel: image generation with diffusion models (SD1.x/2.x, SDXL, FLUX.1, FLUX.2 Klein, Z-Image) on ggml", "easel"};
    app.set_version_flag("--version", std::string("easel ") + EASEL_VERSION + " (ggml " + EASEL_GGML_SOURCE + " " +
                                          std::string(EASEL_GGML_COMMIT).substr(0, 12) + ")");
    app.require_subcommand(0, 1);
    app.footer("Run `easel <command> --help` for a command's options and examples.");

    bool list_devices = false;
    app.add_flag("--list-devices", list_devices, "Same as `easel devices`");
    cli::CommonOptions common;
    cli::add_common_options(app, common);

    auto& reg = cli::registry();
    std::stable_sort(reg.begin(), reg.end(), [](const cli::Command& a, const cli::Command& b) { return a.order < b.order; });
    std::vector<std::pair<CLI::App*, std::function<int()>>> runs;
    for (auto& c : reg) {
        CLI::App* sub = app.add_subcommand(c.name, c.help);
        runs.emplace_back(sub, c.setup(*sub));
    }

    // sd-cli compatibility: `easel -m model -p prompt ...` (no subcommand) means `easel generate ...`.
    // UTF-8 on every platform (Windows: read as UTF-16 and converted, platform::utf8_args)
    std::vector<std::string> args = platform::utf8_args(argc, argv);
    if (!args.empty()) args.erase(args.begin());
    {
        static const std::set<std::string> top_only{"-h", "--help", "--version", "--list-devices", "-v", "--verbose", "--color"};
        bool has_sub = false, has_other = false;
        for (size_t i = 0; i < args.size(); ++i) {
            const std::string& a = args[i];
            if (!a.empty() && a[0] != '-') {
                for (auto& c : reg)
                    if (c.name == a) has_sub = true;
                break;
            }
            if (a == "--rpc-servers") { ++i; continue; }
            if (a == "-M" || a == "--mode") {  // sd-cli's mode: its value (upscale) is not the upscale command
                has_other = true;
                ++i;
                continue;
            }
            if (!top_only.count(a) && a.rfind("--rpc-servers=", 0) != 0) has_other = true;
        }
        if (!has_sub && has_other) args.insert(args.begin(), "generate");
    }
    std::reverse(args.begin(), args.end());

    try {
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        // --help and --version (exit code 0) print as CLI11 does; a parse error follows easel's
        // error convention: one line "error: ...", exit 1 (CLI11 would print two lines, exit 101-127).
        if (e.get_exit_code() == 0) return app.exit(e);
        std::string m = e.what();
        for (auto& c : m)
            if (c == '\n') c = ' ';
        while (!m.empty() && m.back() == ' ') m.pop_back();
        std::fprintf(stderr, "error: %s (see --help)\n", m.c_str());
        return 1;
    }

    HeldGgmlLines held;
    try {
        cli::apply_common_options(common);
        for (auto& [sub, run] : runs)
            if (sub->parsed()) return run();
        if (list_devices) {
            for (auto& [sub, run] : runs)
                if (sub->get_name() == "devices") return run();
        }
        std::fputs(app.help().c_str(), stdout);
        return 0;
    } catch (const Error& e) {
        held.dismiss();
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        held.dismiss();
        std::fprintf(stderr, "error: out of host memory (the job's buffers do not fit: use a smaller -W/-H or --vae-tiling)\n");
        return 1;
    } catch (const std::exception& e) {
        held.dismiss();
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
