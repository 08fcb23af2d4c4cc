#include "text/clip_tokenizer.h"
#include "core/platform.h"

#include "core/error.h"
#include "text/unicode.h"

#include <zlib.h>

#include <array>
#include <climits>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

extern "C" const unsigned char easel_clip_vocab_gz[];
extern "C" const unsigned long easel_clip_vocab_gz_size;

namespace easel::text {
namespace {

constexpr std::string_view kStart = "<|startoftext|>";
constexpr std::string_view kEnd = "<|endoftext|>";
constexpr std::string_view kEndOfWord = "</w>";

// Inflates gzip (or zlib) data. Throws Error(InvalidInput) on corrupt input.
std::string gunzip(const unsigned char* data, size_t size, const std::string& what) {
    z_stream zs{};
    if (inflateInit2(&zs, 15 + 32) != Z_OK)  // +32: detect gzip or zlib header
        fail(ErrorKind::Internal, "zlib inflateInit2 failed while reading {}", what);
    zs.next_in = const_cast<Bytef*>(data);
    zs.avail_in = static_cast<uInt>(size);
    std::string out;
    std::array<char, 1 << 16> buf;
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
        zs.next_out = reinterpret_cast<Bytef*>(buf.data());
        zs.avail_out = static_cast<uInt>(buf.size());
        rc = inflate(&zs, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END) {
            inflateEnd(&zs);
            fail(ErrorKind::InvalidInput, "{} is not valid gzip data (zlib error {}); re-download the file", what, rc);
        }
        out.append(buf.data(), buf.size() - zs.avail_out);
        if (rc == Z_OK && zs.avail_in == 0 && zs.avail_out != 0) {
            inflateEnd(&zs);
            fail(ErrorKind::InvalidInput, "{} is truncated gzip data; re-download the file", what);
        }
    }
    inflateEnd(&zs);
    return out;
}

// GPT-2 / CLIP bytes_to_unicode: printable bytes map to themselves, the others to 256+n.
// Returns (byte -> code point) and the byte order used for the first 256 vocabulary ids.
struct ByteMap {
    std::array<char32_t, 256> to_cp{};
    std::array<uint8_t, 256> order{};  // order[i] = byte of vocabulary id i
    std::unordered_map<char32_t, uint8_t> from_cp;
};

ByteMap make_byte_map() {
    ByteMap m;
    std::array<bool, 256> printable{};
    int k = 0;
    for (int b = 0; b < 256; ++b) {
        if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
            printable[b] = true;
            m.to_cp[b] = static_cast<char32_t>(b);
            m.order[k++] = static_cast<uint8_t>(b);
        }
    }
    int n = 0;
    for (int b = 0; b < 256; ++b) {
        if (!printable[b]) {
            m.to_cp[b] = static_cast<char32_t>(256 + n++);
            m.order[k++] = static_cast<uint8_t>(b);
        }
    }
    for (int b = 0; b < 256; ++b) m.from_cp[m.to_cp[b]] = static_cast<uint8_t>(b);
    return m;
}

bool starts_with(std::u32string_view s, size_t i, std::string_view ascii) {
    if (s.size() - i < ascii.size()) return false;
    for (size_t j = 0; j < ascii.size(); ++j)
        if (s[i + j] != static_cast<char32_t>(ascii[j])) return false;
    return true;
}

}  // namespace

struct ClipTokenizer::Impl {
    ByteMap bytes = make_byte_map();
    std::vector<std::string> vocab;                     // id -> token (UTF-8 of mapped code points)
    std::unordered_map<std::string, int32_t> ids;       // token -> id
    std::unordered_map<std::string, int32_t> ranks;     // "a b" -> merge rank
    mutable std::mutex cache_mutex;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

    // BPE of one pre-token (UTF-8). Returns its ids.
    std::vector<int32_t> bpe(const std::string& piece) const {
        if (piece == kStart) return {kBos};
        if (piece == kEnd) return {kEos};
        {
            std::lock_guard lock(cache_mutex);
            if (auto it = cache.find(piece); it != cache.end()) return it->second;
        }
        std::vector<std::string> word;
        for (unsigned char b : piece) {
            std::string sym;
            utf8_append(sym, bytes.to_cp[b]);
            word.push_back(std::move(sym));
        }
        if (word.empty()) return {};
        word.back() += kEndOfWord;
        std::string key;
        while (word.size() > 1) {
            int32_t best = INT32_MAX;
            size_t best_i = 0;
            for (size_t i = 0; i + 1 < word.size(); ++i) {
                key.assign(word[i]).append(" ").append(word[i + 1]);
                auto it = ranks.find(key);
                if (it != ranks.end() && it->second < best) {
                    best = it->second;
                    best_i = i;
                }
            }
            if (best == INT32_MAX) break;
            const std::string first = word[best_i], second = word[best_i + 1];
            std::vector<std::string> merged;
            merged.reserve(word.size());
            for (size_t i = 0; i < word.size();) {
                if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
                    merged.push_back(first + second);
                    i += 2;
                } else {
                    merged.push_back(word[i]);
                    ++i;
                }
            }
            word = std::move(merged);
        }
        std::vector<int32_t> out;
        out.reserve(word.size());
        for (const auto& sym : word) {
            auto it = ids.find(sym);
            if (it == ids.end())  // cannot happen: every byte symbol is in the vocabulary
                fail(ErrorKind::Internal, "CLIP BPE produced symbol '{}' missing from the vocabulary", sym);
            out.push_back(it->second);
        }
        std::lock_guard lock(cache_mutex);
        if (cache.size() > 200000) cache.clear();
        cache.emplace(piece, out);
        return out;
    }
};

ClipTokenizer::ClipTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClipTokenizer::ClipTokenizer(ClipTokenizer&&) noexcept = default;
ClipTokenizer& ClipTokenizer::operator=(ClipTokenizer&&) noexcept = default;
ClipTokenizer::~ClipTokenizer() = default;

ClipTokenizer ClipTokenizer::from_merges_text(std::string_view text, size_t n_merges) {
    auto impl = std::make_unique<Impl>();
    auto& vocab = impl->vocab;
    vocab.reserve(512 + n_merges + 2);
    for (int i = 0; i < 256; ++i) {
        std::string s;
        utf8_append(s, impl->bytes.to_cp[impl->bytes.order[i]]);
        vocab.push_back(std::move(s));
    }
    for (int i = 0; i < 256; ++i) vocab.push_back(vocab[i] + std::string(kEndOfWord));

    // Line 0 is the version header; merges follow, one "a b" per line.
    size_t pos = text.find('\n');
    if (pos == std::string_view::npos)
        fail(ErrorKind::InvalidInput, "CLIP merges text has no merge lines; expected bpe_simple_vocab_16e6.txt");
    ++pos;
    size_t line_no = 1;
    while (impl->ranks.size() < n_merges) {
        if (pos >= text.size())
            fail(ErrorKind::InvalidInput, "CLIP merges text has {} merges, {} needed; expected bpe_simple_vocab_16e6.txt",
                 impl->ranks.size(), n_merges);
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) end = text.size();
        std::string_view line = text.substr(pos, end - pos);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        pos = end + 1;
        ++line_no;
        const size_t sp = line.find(' ');
        if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size() ||
            line.find(' ', sp + 1) != std::string_view::npos)
            fail(ErrorKind::InvalidInput, "CLIP merges line {} is '{}', expected two symbols separated by one space",
                 line_no, line);
        const int32_t rank = static_cast<int32_t>(impl->ranks.size());
        impl->ranks.emplace(std::string(line), rank);
        std::string merged(line.substr(0, sp));
        merged.append(line.substr(sp + 1));
        vocab.push_back(std::move(merged));
    }
    vocab.emplace_back(kStart);
    vocab.emplace_back(kEnd);
    impl->ids.reserve(vocab.size());
    for (size_t i = 0; i < vocab.size(); ++i) impl->ids.emplace(vocab[i], static_cast<int32_t>(i));
    if (n_merges == kDefaultMerges &&
        (impl->ids.at(std::string(kStart)) != kBos || impl->ids.at(std::string(kEnd)) != kEos))
        fail(ErrorKind::InvalidInput, "CLIP vocabulary has duplicate entries; expected bpe_simple_vocab_16e6.txt");
    return ClipTokenizer(std::move(impl));
}

ClipTokenizer ClipTokenizer::from_file(const std::filesystem::path& path, size_t n_merges) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(ErrorKind::Io, "cannot open CLIP vocabulary file {}; check the path", platform::path_utf8(path));
    std::stringstream ss;
    ss << f.rdbuf();
    std::string data = ss.str();
    if (data.size() >= 2 && static_cast<unsigned char>(data[0]) == 0x1F && static_cast<unsigned char>(data[1]) == 0x8B)
        data = gunzip(reinterpret_cast<const unsigned char*>(data.data()), data.size(), platform::path_utf8(path));
    return from_merges_text(data, n_merges);
}

const ClipTokenizer& ClipTokenizer::builtin() {
    static const ClipTokenizer tok = [] {
        const std::string text = gunzip(easel_clip_vocab_gz, easel_clip_vocab_gz_size, "the embedded CLIP vocabulary");
        return from_merges_text(text);
    }();
    return tok;
}

std::string ClipTokenizer::normalize(std::string_view text) {
    const std::u32string n = nfc(utf8_decode(text));
    std::u32string collapsed;
    collapsed.reserve(n.size());
    bool in_space = false;
    for (char32_t c : n) {
        if (is_space(c)) {
            if (!in_space) collapsed.push_back(U' ');
            in_space = true;
        } else {
            collapsed.push_back(c);
            in_space = false;
        }
    }
    return utf8_encode(to_lower(collapsed));
}

std::vector<std::string> ClipTokenizer::pre_tokenize(std::string_view normalized) {
    const std::u32string s = utf8_decode(normalized);
    std::vector<std::string> out;
    size_t i = 0;
    const size_t n = s.size();
    auto emit = [&](size_t a, size_t b) { out.push_back(utf8_encode(std::u32string_view(s).substr(a, b - a))); };
    while (i < n) {
        const char32_t c = s[i];
        if (c == U'<' && starts_with(s, i, kStart)) { emit(i, i + kStart.size()); i += kStart.size(); continue; }
        if (c == U'<' && starts_with(s, i, kEnd)) { emit(i, i + kEnd.size()); i += kEnd.size(); continue; }
        if (c == U'\'' && i + 1 < n) {
            const char32_t d = s[i + 1];
            if (d == U's' || d == U't' || d == U'm' || d == U'd') { emit(i, i + 2); i += 2; continue; }
            if (starts_with(s, i, "'re") || starts_with(s, i, "'ve") || starts_with(s, i, "'ll")) {
                emit(i, i + 3);
                i += 3;
                continue;
            }
        }
        if (is_letter(c)) {
            size_t j = i + 1;
            while (j < n && is_letter(s[j])) ++j;
            emit(i, j);
            i = j;
            continue;
        }
        if (is_number(c)) { emit(i, i + 1); ++i; continue; }
        if (is_space(c)) { ++i; continue; }
        size_t j = i + 1;
        while (j < n && !is_space(s[j]) && !is_letter(s[j]) && !is_number(s[j])) ++j;
        emit(i, j);
        i = j;
    }
    return out;
}

std::vector<int32_t> ClipTokenizer::encode(std::string_view text) const {
    std::vector<int32_t> out;
    for (const std::string& piece : pre_tokenize(normalize(text))) {
        const auto ids = impl_->bpe(piece);
        out.insert(out.end(), ids.begin(), ids.end());
    }
    return out;
}

std::vector<int32_t> ClipTokenizer::encode_with_special(std::string_view text) const {
    std::vector<int32_t> out{kBos};
    const auto ids = encode(text);
    out.insert(out.end(), ids.begin(), ids.end());
    out.push_back(kEos);
    return out;
}

std::vector<int32_t> ClipTokenizer::encode_window(std::string_view text, int32_t pad_id, int length) const {
    if (length < 2) fail(ErrorKind::InvalidInput, "CLIP window length {} is too small; use 77", length);
    auto ids = encode(text);
    if (ids.size() > static_cast<size_t>(length - 2)) ids.resize(length - 2);
    std::vector<int32_t> out;
    out.reserve(length);
    out.push_back(kBos);
    out.insert(out.end(), ids.begin(), ids.end());
    out.push_back(kEos);
    out.resize(length, pad_id);
    return out;
}

std::string ClipTokenizer::decode(std::span<const int32_t> ids) const {
    std::string mapped;
    for (int32_t id : ids) {
        if (id < 0 || static_cast<size_t>(id) >= impl_->vocab.size())
            fail(ErrorKind::InvalidInput, "CLIP token id {} is outside [0, {})", id, impl_->vocab.size());
        if (id == kBos || id == kEos) continue;
        mapped += impl_->vocab[id];
    }
    std::string bytes;
    for (char32_t c : utf8_decode(mapped)) {
        auto it = impl_->bytes.from_cp.find(c);
        if (it != impl_->bytes.from_cp.end()) bytes.push_back(static_cast<char>(it->second));
    }
    std::string out;
    for (size_t p = 0;;) {
        size_t q = bytes.find(kEndOfWord, p);
        if (q == std::string::npos) { out.append(bytes, p); break; }
        out.append(bytes, p, q - p).push_back(' ');
        p = q + kEndOfWord.size();
    }
    return utf8_encode(utf8_decode(out));  // invalid byte sequences -> U+FFFD
}

std::optional<int32_t> ClipTokenizer::token_id(std::string_view token) const {
    auto it = impl_->ids.find(std::string(token));
    if (it == impl_->ids.end()) return std::nullopt;
    return it->second;
}

const std::string& ClipTokenizer::token(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= impl_->vocab.size())
        fail(ErrorKind::InvalidInput, "CLIP token id {} is outside [0, {})", id, impl_->vocab.size());
    return impl_->vocab[id];
}

size_t ClipTokenizer::vocab_size() const { return impl_->vocab.size(); }

}  // namespace easel::text
