#include "text/unicode.h"

#include <algorithm>
#include <array>

namespace easel::text {
namespace {

struct CodeRange { char32_t lo, hi; };
struct LowerMap { char32_t cp; std::array<char32_t, 3> lower; };
struct CombiningClass { char32_t cp; uint8_t ccc; };
struct Decomposition { char32_t cp; char32_t first, second; };
struct Composition { char32_t first, second, composite; };

#include "text/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t cp) {
    auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                               [](char32_t v, const CodeRange& r) { return v < r.lo; });
    if (it == std::begin(table)) return false;
    --it;
    return cp >= it->lo && cp <= it->hi;
}

uint8_t combining_class(char32_t cp) {
    auto it = std::lower_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                               [](const CombiningClass& c, char32_t v) { return c.cp < v; });
    return (it != std::end(kCombiningClass) && it->cp == cp) ? it->ccc : 0;
}

// Hangul syllable constants (Unicode chapter 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

void decompose(char32_t cp, std::u32string& out) {
    if (cp >= kSBase && cp < kSBase + kSCount) {
        char32_t s = cp - kSBase;
        out.push_back(kLBase + s / kNCount);
        out.push_back(kVBase + (s % kNCount) / kTCount);
        if (s % kTCount) out.push_back(kTBase + s % kTCount);
        return;
    }
    auto it = std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp,
                               [](const Decomposition& d, char32_t v) { return d.cp < v; });
    if (it == std::end(kDecomp) || it->cp != cp) {
        out.push_back(cp);
        return;
    }
    decompose(it->first, out);
    if (it->second) decompose(it->second, out);
}

// Returns the primary composite of (a, b) or 0.
char32_t compose(char32_t a, char32_t b) {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
        return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
        b < kTBase + kTCount)
        return a + (b - kTBase);
    auto it = std::lower_bound(std::begin(kCompose), std::end(kCompose), std::pair{a, b},
                               [](const Composition& c, std::pair<char32_t, char32_t> v) {
                                   return std::pair{c.first, c.second} < v;
                               });
    return (it != std::end(kCompose) && it->first == a && it->second == b) ? it->composite : 0;
}

}  // namespace

std::u32string utf8_decode(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    size_t i = 0;
    const size_t n = s.size();
    while (i < n) {
        const auto b0 = static_cast<unsigned char>(s[i]);
        if (b0 < 0x80) {
            out.push_back(b0);
            ++i;
            continue;
        }
        int len = 0;
        char32_t cp = 0, min = 0;
        if (b0 >= 0xC2 && b0 <= 0xDF) { len = 2; cp = b0 & 0x1F; min = 0x80; }
        else if (b0 >= 0xE0 && b0 <= 0xEF) { len = 3; cp = b0 & 0x0F; min = 0x800; }
        else if (b0 >= 0xF0 && b0 <= 0xF4) { len = 4; cp = b0 & 0x07; min = 0x10000; }
        else { out.push_back(0xFFFD); ++i; continue; }
        int k = 1;
        for (; k < len && i + k < n; ++k) {
            const auto b = static_cast<unsigned char>(s[i + k]);
            if ((b & 0xC0) != 0x80) break;
            cp = (cp << 6) | (b & 0x3F);
        }
        if (k < len || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            // Overlong form or surrogate: replace the lead byte only (its continuation bytes then
            // become U+FFFD each); truncated sequence: replace the valid prefix once.
            out.push_back(0xFFFD);
            i += (k == len) ? 1 : static_cast<size_t>(k);
            continue;
        }
        out.push_back(cp);
        i += len;
    }
    return out;
}

void utf8_append(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

std::string utf8_encode(std::u32string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char32_t c : s) utf8_append(out, c);
    return out;
}

size_t first_invalid_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        const auto b = (unsigned char)s[i];
        int n = 0;
        unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
        if (b < 0x80) { ++i; continue; }
        if (b >= 0xC2 && b <= 0xDF) n = 1;
        else if (b == 0xE0) { n = 2; lo = 0xA0; }
        else if (b == 0xED) { n = 2; hi = 0x9F; }
        else if (b >= 0xE1 && b <= 0xEF) n = 2;
        else if (b == 0xF0) { n = 3; lo = 0x90; }
        else if (b == 0xF4) { n = 3; hi = 0x8F; }
        else if (b >= 0xF1 && b <= 0xF3) n = 3;
        else return i;
        for (int k = 1; k <= n; ++k) {
            if (i + k >= s.size()) return i;  // cut off at the end: the lead byte starts no whole character
            const auto c = (unsigned char)s[i + k];
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return i + k;
        }
        i += n + 1;
    }
    return std::string::npos;
}

bool utf8_valid(std::string_view s) {
    const std::u32string d = utf8_decode(s);
    return utf8_encode(d) == s;
}

bool is_letter(char32_t cp) {
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
    return in_ranges(kLetterRanges, cp);
}
bool is_number(char32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(kNumberRanges, cp);
}
bool is_space(char32_t cp) { return in_ranges(kSpaceRanges, cp); }

std::u32string to_lower(std::u32string_view s) {
    std::u32string out;
    out.reserve(s.size());
    for (char32_t c : s) {
        if (c < 0x80) {
            out.push_back((c >= 'A' && c <= 'Z') ? c + 32 : c);
            continue;
        }
        auto it = std::lower_bound(std::begin(kLower), std::end(kLower), c,
                                   [](const LowerMap& m, char32_t v) { return m.cp < v; });
        if (it == std::end(kLower) || it->cp != c) {
            out.push_back(c);
            continue;
        }
        for (char32_t l : it->lower)
            if (l) out.push_back(l);
    }
    return out;
}

std::u32string nfc(std::u32string_view s) {
    // Fast path: pure ASCII is already NFC.
    if (std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0x80; })) return std::u32string(s);
    // 1. Canonical decomposition.
    std::u32string d;
    d.reserve(s.size());
    for (char32_t c : s) decompose(c, d);
    // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
    for (size_t i = 0; i < d.size();) {
        if (combining_class(d[i]) == 0) { ++i; continue; }
        size_t j = i;
        while (j < d.size() && combining_class(d[j]) != 0) ++j;
        std::stable_sort(d.begin() + i, d.begin() + j,
                         [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
        i = j;
    }
    // 3. Canonical composition (UAX #15, D117).
    std::u32string out;
    out.reserve(d.size());
    size_t starter = std::u32string::npos;  // index in `out` of the last starter
    int last_ccc = -1;                      // ccc of the last character appended after it
    for (char32_t c : d) {
        const int ccc = combining_class(c);
        if (starter != std::u32string::npos) {
            const bool blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= ccc);
            if (!blocked) {
                if (char32_t comp = compose(out[starter], c)) {
                    out[starter] = comp;
                    continue;
                }
            }
        }
        out.push_back(c);
        if (ccc == 0) {
            starter = out.size() - 1;
            last_ccc = -1;
        } else {
            last_ccc = ccc;
        }
    }
    return out;
}

}  // namespace easel::text
