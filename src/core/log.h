// Minimal levelled logging to stderr. Messages are single lines; the CLI sets the level
// from -v (debug) and --color.
#pragma once

#include <fmt/format.h>

#include <cstdio>

namespace easel::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3, Quiet = 4 };

/// Current threshold: messages below it are dropped. Default Info.
Level level();
void set_level(Level l);
/// Whether warnings/errors are coloured with ANSI escapes (default: off).
void set_color(bool on);
/// Writes one line "<prefix>message" to stderr if lvl >= level().
void write(Level lvl, const std::string& msg);

template <typename... A> void debug(fmt::format_string<A...> f, A&&... a) {
    if (level() <= Level::Debug) write(Level::Debug, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A> void info(fmt::format_string<A...> f, A&&... a) {
    if (level() <= Level::Info) write(Level::Info, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A> void warn(fmt::format_string<A...> f, A&&... a) {
    if (level() <= Level::Warn) write(Level::Warn, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace easel::log
