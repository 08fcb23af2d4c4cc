// Errors raised by the easel library.
//
// Inside the library every failure a user can cause is thrown as easel::Error with a
// category and a one-line message that names the problem and the fix. The CLI prints the
// message on one line and exits with status 1; the C API maps the category to an error code.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace easel {

/// What kind of failure an Error reports.
enum class ErrorKind {
    InvalidInput,   ///< bad flag, bad size, malformed file content
    ModelMismatch,  ///< a file of the wrong family/kind for the slot it was given in
    OutOfMemory,    ///< a budget too small or an allocation that failed
    Io,             ///< a file that cannot be opened, read or written
    Unsupported,    ///< valid input that this build cannot handle (e.g. a backend not compiled in)
    Internal,       ///< a broken invariant inside easel (a bug)
};

/// Human-readable name of an ErrorKind ("invalid input", "I/O error", ...).
const char* error_kind_name(ErrorKind kind);

/// The exception type of the library. what() is the one-line message.
class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, std::string message) : std::runtime_error(std::move(message)), kind_(kind) {}
    ErrorKind kind() const noexcept { return kind_; }

private:
    ErrorKind kind_;
};

/// Throws Error(kind, fmt::format(f, args...)).
template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
    throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace easel
