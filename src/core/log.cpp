#include "core/log.h"

#include <atomic>
#include <mutex>

namespace easel::log {

namespace {
std::atomic<Level> g_level{Level::Info};
std::atomic<bool> g_color{false};
std::mutex g_mutex;
}  // namespace

Level level() { return g_level.load(); }
void set_level(Level l) { g_level.store(l); }
void set_color(bool on) { g_color.store(on); }

void write(Level lvl, const std::string& msg) {
    if (lvl < g_level.load()) return;
    const bool c = g_color.load();
    const char* prefix = "";
    const char* on = "";
    switch (lvl) {
        case Level::Debug: prefix = "debug: "; on = "\033[2m"; break;
        case Level::Info: break;
        case Level::Warn: prefix = "warning: "; on = "\033[33m"; break;
        case Level::Error: prefix = "error: "; on = "\033[31m"; break;
        case Level::Quiet: return;
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    if (c && *on) std::fprintf(stderr, "%s%s%s\033[0m\n", on, prefix, msg.c_str());
    else std::fprintf(stderr, "%s%s\n", prefix, msg.c_str());
}

}  // namespace easel::log
