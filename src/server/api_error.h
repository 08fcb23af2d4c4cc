// The error every request parser and route raises for a request it refuses: an HTTP status, the
// request field at fault (empty when none) and one line that names the problem and the fix.
// The HTTP layer writes it in the shape of the API the request came through (docs/server.md).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace easel::server {

class ApiError : public std::runtime_error {
public:
    ApiError(int status, std::string field, std::string message)
        : std::runtime_error(std::move(message)), status_(status), field_(std::move(field)) {}
    int status() const noexcept { return status_; }
    const std::string& field() const noexcept { return field_; }

private:
    int status_;
    std::string field_;
};

/// Throws ApiError(status, field, fmt::format(f, args...)).
template <typename... Args>
[[noreturn]] void refuse(int status, std::string field, fmt::format_string<Args...> f, Args&&... args) {
    throw ApiError(status, std::move(field), fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace easel::server
