// Base64 (RFC 4648, standard alphabet) for images in JSON request and response bodies, and
// data URLs ("data:image/png;base64,...") as A1111 and sd.cpp accept them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace easel::server {

/// Standard base64 with '=' padding.
std::string base64_encode(std::span<const uint8_t> bytes);

/// Decodes standard base64 (also URL-safe '-' '_'), padding optional, ASCII whitespace skipped;
/// a "data:<mime>;base64," prefix is removed first. nullopt for any other character, a length
/// that cannot be base64 (1 char left over), data after padding, or when the decoded size would
/// exceed max_bytes (checked before decoding anything).
std::optional<std::vector<uint8_t>> base64_decode(std::string_view text, size_t max_bytes);

}  // namespace easel::server
