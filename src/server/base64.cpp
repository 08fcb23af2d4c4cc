#include "server/base64.h"

#include <array>

namespace easel::server {

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// 0..63 for alphabet characters (both alphabets), -1 otherwise.
constexpr std::array<int8_t, 256> make_table() {
    std::array<int8_t, 256> t{};
    for (auto& v : t) v = -1;
    for (int i = 0; i < 64; ++i) t[(unsigned char)kAlphabet[i]] = (int8_t)i;
    t[(unsigned char)'-'] = 62;
    t[(unsigned char)'_'] = 63;
    return t;
}
constexpr auto kTable = make_table();

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
}  // namespace

std::string base64_encode(std::span<const uint8_t> b) {
    std::string out;
    out.reserve((b.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= b.size(); i += 3) {
        const uint32_t v = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8 | b[i + 2];
        out += kAlphabet[v >> 18];
        out += kAlphabet[(v >> 12) & 63];
        out += kAlphabet[(v >> 6) & 63];
        out += kAlphabet[v & 63];
    }
    if (i + 1 == b.size()) {
        const uint32_t v = (uint32_t)b[i] << 16;
        out += kAlphabet[v >> 18];
        out += kAlphabet[(v >> 12) & 63];
        out += "==";
    } else if (i + 2 == b.size()) {
        const uint32_t v = (uint32_t)b[i] << 16 | (uint32_t)b[i + 1] << 8;
        out += kAlphabet[v >> 18];
        out += kAlphabet[(v >> 12) & 63];
        out += kAlphabet[(v >> 6) & 63];
        out += '=';
    }
    return out;
}

std::optional<std::vector<uint8_t>> base64_decode(std::string_view s, size_t max_bytes) {
    if (s.substr(0, 5) == "data:") {  // data URL: the payload follows the first ','
        const size_t comma = s.find(',');
        if (comma == std::string_view::npos || s.substr(0, comma).find(";base64") == std::string_view::npos) return std::nullopt;
        s.remove_prefix(comma + 1);
    }
    // count the payload characters first: the size is bounded before any allocation
    size_t n = 0, pad = 0;
    for (char c : s) {
        if (is_space(c)) continue;
        if (c == '=') {
            ++pad;
            continue;
        }
        if (pad > 0 || kTable[(unsigned char)c] < 0) return std::nullopt;  // data after padding, or a foreign character
        ++n;
    }
    if (pad > 2 || n % 4 == 1) return std::nullopt;
    if (pad > 0 && (n + pad) % 4 != 0) return std::nullopt;
    const size_t out_size = n / 4 * 3 + (n % 4 == 0 ? 0 : n % 4 - 1);
    if (out_size > max_bytes) return std::nullopt;
    std::vector<uint8_t> out;
    out.reserve(out_size);
    uint32_t acc = 0;
    int bits = 0;
    for (char c : s) {
        if (is_space(c) || c == '=') continue;
        acc = acc << 6 | (uint32_t)kTable[(unsigned char)c];
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back((uint8_t)(acc >> bits));
            acc &= (1u << bits) - 1;
        }
    }
    return out;
}

}  // namespace easel::server
