// The restricted unpickler (see pickle.h). Opcode meanings: CPython Lib/pickle.py and
// Lib/pickletools.py (protocols 0-5); PyTorch's use of them: torch/serialization.py (persistent
// ids of storages) and torch/_utils.py (the _rebuild_* functions' arguments).
#include "io/pickle.h"

#include "core/error.h"
#include "io/readers.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

namespace easel::io::pickle {

namespace {

using K = Node::Kind;

// The allowed globals.
enum class G {
    OrderedDict, RebuildTensorV2, RebuildTensor, RebuildParameter, RebuildParameterWithState, RebuildFromTypeV2,
    TorchTensor, TorchParameter, TorchSize, Set, FrozenSet, CodecsEncode, NumpyDtype, NumpyScalar, InertClass,
    StorageType, TorchDtype,
};

struct GlobalInfo {
    G id;
    DType dtype = DType::U8;  // StorageType
};

// "module.name" -> what it is. Module aliases (__builtin__, numpy._core, lightning.pytorch) are
// folded before the lookup.
const std::map<std::string, GlobalInfo>& allowed_globals() {
    static const std::map<std::string, GlobalInfo> m = [] {
        std::map<std::string, GlobalInfo> r = {
            {"collections.OrderedDict", {G::OrderedDict}},
            {"torch._utils._rebuild_tensor_v2", {G::RebuildTensorV2}},
            {"torch._utils._rebuild_tensor", {G::RebuildTensor}},
            {"torch._utils._rebuild_parameter", {G::RebuildParameter}},
            {"torch._utils._rebuild_parameter_with_state", {G::RebuildParameterWithState}},
            {"torch._tensor._rebuild_from_type_v2", {G::RebuildFromTypeV2}},
            {"torch.Tensor", {G::TorchTensor}},
            {"torch.nn.parameter.Parameter", {G::TorchParameter}},
            {"torch.Size", {G::TorchSize}},
            {"builtins.set", {G::Set}},
            {"builtins.frozenset", {G::FrozenSet}},
            {"_codecs.encode", {G::CodecsEncode}},
            {"numpy.dtype", {G::NumpyDtype}},
            {"numpy.core.multiarray.scalar", {G::NumpyScalar}},
            {"pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint", {G::InertClass}},
        };
        const std::pair<const char*, DType> storages[] = {
            {"DoubleStorage", DType::F64}, {"FloatStorage", DType::F32}, {"HalfStorage", DType::F16},
            {"BFloat16Storage", DType::BF16}, {"LongStorage", DType::I64}, {"IntStorage", DType::I32},
            {"ShortStorage", DType::I16}, {"CharStorage", DType::I8}, {"ByteStorage", DType::U8},
            {"BoolStorage", DType::BOOL}, {"UntypedStorage", DType::U8}, {"Float8_e4m3fnStorage", DType::F8_E4M3},
            {"Float8_e5m2Storage", DType::F8_E5M2},
        };
        for (auto& [n, d] : storages) {
            r[std::string("torch.") + n] = {G::StorageType, d};
            r[std::string("torch.cuda.") + n] = {G::StorageType, d};
        }
        for (const char* d : {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                              "double", "float", "half", "long", "int", "short"})
            r[std::string("torch.") + d] = {G::TorchDtype};
        return r;
    }();
    return m;
}

std::string fold_module(std::string m) {
    if (m == "__builtin__") return "builtins";
    if (m.rfind("numpy._core", 0) == 0) return "numpy.core" + m.substr(11);
    if (m.rfind("lightning.pytorch.", 0) == 0) return "pytorch_lightning." + m.substr(18);
    return m;
}

// A name from the file, made safe for a one-line message.
std::string printable(const std::string& s, size_t max = 100) {
    std::string r;
    for (char c : s.substr(0, max)) r += ((unsigned char)c < 0x20 || c == 0x7f) ? '?' : c;
    if (s.size() > max) r += "...";
    return r;
}

const char* kind_name(K k) {
    switch (k) {
        case K::None: return "None";
        case K::Bool: return "a bool";
        case K::Int: return "an int";
        case K::BigInt: return "a long int";
        case K::Float: return "a float";
        case K::String: return "a string";
        case K::Bytes: return "bytes";
        case K::List: return "a list";
        case K::Tuple: return "a tuple";
        case K::Dict: return "a dict";
        case K::Global: return "a global";
        case K::Storage: return "a storage";
        case K::Tensor: return "a tensor";
        case K::Object: return "an object";
    }
    return "?";
}

// Appends code point cp as UTF-8.
void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += (char)cp;
    else if (cp < 0x800) {
        out += (char)(0xC0 | (cp >> 6));
        out += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += (char)(0xE0 | (cp >> 12));
        out += (char)(0x80 | ((cp >> 6) & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    } else {
        out += (char)(0xF0 | (cp >> 18));
        out += (char)(0x80 | ((cp >> 12) & 0x3F));
        out += (char)(0x80 | ((cp >> 6) & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    }
}

class Machine {
public:
    Machine(std::span<const uint8_t> d, const std::string& label) : d_(d), label_(label) {}

    Unpickled run() {
        for (;;) {
            if (pos_ >= d_.size()) bad("the pickle ends without a STOP opcode (truncated file)");
            const size_t at = pos_;
            const uint8_t op = d_[pos_++];
            switch (op) {
                case '(': marks_.push_back(stack_.size()); break;
                case '.': {
                    // as CPython's load_stop: the top of the stack is the result (values left
                    // below it, which torch.save never leaves, are ignored)
                    out_.root = top();
                    out_.consumed = pos_;
                    return std::move(out_);
                }
                case '0':
                    if (!stack_.empty() && (marks_.empty() || marks_.back() < stack_.size())) stack_.pop_back();
                    else pop_mark();
                    break;
                case '1': pop_mark(); break;
                case '2': push(top()); break;
                case 'F': {
                    std::string l = line();
                    char* end = nullptr;
                    const double v = std::strtod(l.c_str(), &end);
                    if (l.empty() || *end) bad(fmt::format("FLOAT '{}' is not a number", printable(l)));
                    push(make_float(v));
                    break;
                }
                case 'I': {
                    std::string l = line();
                    if (l == "00") push(make_bool(false));
                    else if (l == "01") push(make_bool(true));
                    else push(make_int(parse_decimal(l, "INT")));
                    break;
                }
                case 'J': push(make_int((int32_t)le(4))); break;
                case 'K': push(make_int((int64_t)le(1))); break;
                case 'M': push(make_int((int64_t)le(2))); break;
                case 'L': {
                    std::string l = line();
                    if (!l.empty() && l.back() == 'L') l.pop_back();
                    push(make_int(parse_decimal(l, "LONG")));
                    break;
                }
                case 0x8a: push(make_long(take(le(1)))); break;
                case 0x8b: push(make_long(take(signed_len(4)))); break;
                case 'N': push(make(K::None)); break;
                case 0x88: push(make_bool(true)); break;
                case 0x89: push(make_bool(false)); break;
                case 'G': {
                    uint64_t bits = 0;
                    for (uint8_t c : take(8)) bits = (bits << 8) | c;
                    double v;
                    std::memcpy(&v, &bits, 8);
                    push(make_float(v));
                    break;
                }
                case 'S': push(make_str(K::Bytes, unquote(line()))); break;
                case 'T': push(make_str(K::Bytes, as_string(take(signed_len(4))))); break;
                case 'U': push(make_str(K::Bytes, as_string(take(le(1))))); break;
                case 'B': push(make_str(K::Bytes, as_string(take(le(4))))); break;
                case 'C': push(make_str(K::Bytes, as_string(take(le(1))))); break;
                case 0x8e: push(make_str(K::Bytes, as_string(take(le(8))))); break;
                case 0x96: push(make_str(K::Bytes, as_string(take(le(8))))); break;
                case 'V': push(make_str(K::String, raw_unicode_escape(line()))); break;
                case 'X': push(make_str(K::String, utf8(take(le(4))))); break;
                case 0x8c: push(make_str(K::String, utf8(take(le(1))))); break;
                case 0x8d: push(make_str(K::String, utf8(take(le(8))))); break;
                case ']': push(make(K::List)); break;
                case ')': push(make(K::Tuple)); break;
                case '}': push(make(K::Dict)); break;
                case 0x8f: push(make(K::List)); break;  // EMPTY_SET: a set is kept as a list
                case 'l': {
                    auto items = pop_to_mark();
                    push(make_seq(K::List, std::move(items)));
                    break;
                }
                case 't': {
                    auto items = pop_to_mark();
                    push(make_seq(K::Tuple, std::move(items)));
                    break;
                }
                case 0x91: {
                    auto items = pop_to_mark();
                    push(make_seq(K::List, std::move(items)));
                    break;
                }
                case 0x85: case 0x86: case 0x87: {
                    const size_t n = op - 0x84;
                    need(n, "TUPLE1/2/3");
                    std::vector<uint32_t> items(stack_.end() - (ptrdiff_t)n, stack_.end());
                    stack_.resize(stack_.size() - n);
                    push(make_seq(K::Tuple, std::move(items)));
                    break;
                }
                case 'd': {
                    auto items = pop_to_mark();
                    if (items.size() % 2) bad("DICT with an odd number of items");
                    push(make_seq(K::Dict, std::move(items)));
                    break;
                }
                case 'a': {
                    need(2, "APPEND");
                    const uint32_t v = pop();
                    append_to(top(), {v});
                    break;
                }
                case 'e': {
                    auto items = pop_to_mark();
                    need(1, "APPENDS");
                    append_to(top(), items);
                    break;
                }
                case 0x90: {
                    auto items = pop_to_mark();
                    need(1, "ADDITEMS");
                    append_to(top(), items);
                    break;
                }
                case 's': {
                    need(3, "SETITEM");
                    const uint32_t v = pop(), k = pop();
                    set_items(top(), {k, v});
                    break;
                }
                case 'u': {
                    auto items = pop_to_mark();
                    if (items.size() % 2) bad("SETITEMS with an odd number of items");
                    need(1, "SETITEMS");
                    set_items(top(), items);
                    break;
                }
                case 'g': get(parse_index(line(), "GET")); break;
                case 'h': get(le(1)); break;
                case 'j': get(le(4)); break;
                case 'p': put(parse_index(line(), "PUT")); break;
                case 'q': put(le(1)); break;
                case 'r': put(le(4)); break;
                case 0x94: put(memo_.size()); break;
                case 'c': {
                    std::string mod = line();
                    std::string name = line();
                    push(global(mod, name));
                    break;
                }
                case 0x93: {
                    need(2, "STACK_GLOBAL");
                    const uint32_t n = pop(), m = pop();
                    if (node(n).kind != K::String || node(m).kind != K::String) bad("STACK_GLOBAL needs two strings");
                    push(global(node(m).s, node(n).s));
                    break;
                }
                case 'R': {
                    need(2, "REDUCE");
                    const uint32_t args = pop(), fn = pop();
                    push(reduce(fn, args));
                    break;
                }
                case 0x81: {
                    need(2, "NEWOBJ");
                    const uint32_t args = pop(), cls = pop();
                    push(newobj(cls, args));
                    break;
                }
                case 0x92: {
                    need(3, "NEWOBJ_EX");
                    const uint32_t kwargs = pop(), args = pop(), cls = pop();
                    if (node(kwargs).kind != K::Dict || !node(kwargs).items.empty()) refuse_call(cls, "NEWOBJ_EX with keyword arguments");
                    push(newobj(cls, args));
                    break;
                }
                case 'b': {
                    need(2, "BUILD");
                    const uint32_t state = pop();
                    build(top(), state);
                    break;
                }
                case 'Q': {
                    need(1, "BINPERSID");
                    push(persistent(pop()));
                    break;
                }
                case 'P': bad("a text persistent id (PERSID): PyTorch writes storages as binary persistent ids; not a PyTorch checkpoint");
                case 0x80: {
                    const uint64_t proto = le(1);
                    if (proto > 5) bad(fmt::format("pickle protocol {} (this reader knows 0 to 5)", proto));
                    break;
                }
                case 0x95: (void)le(8); break;  // FRAME: a length hint
                case 'i': case 'o':
                    bad("it builds a class instance with INST/OBJ, which a tensor checkpoint never does; nothing in it was run");
                case 0x82: case 0x83: case 0x84:
                    bad("it uses the copyreg extension registry (EXT1/2/4), which a tensor checkpoint never does; nothing in it was run");
                case 0x97: case 0x98: bad("it uses out-of-band buffers (pickle protocol 5), which torch.save never writes");
                default: bad(fmt::format("unknown pickle opcode 0x{:02x} at byte {}", op, at));
            }
        }
    }

private:
    std::span<const uint8_t> d_;
    const std::string& label_;
    size_t pos_ = 0;
    Unpickled out_;
    std::vector<uint32_t> stack_;
    std::vector<size_t> marks_;
    std::unordered_map<uint64_t, uint32_t> memo_;

    [[noreturn]] void bad(const std::string& what) const {
        fail(ErrorKind::InvalidInput, "'{}' is not a PyTorch checkpoint easel can read: {}", label_, what);
    }
    [[noreturn]] void refuse_global(const std::string& name) const {
        fail(ErrorKind::InvalidInput,
             "'{}' is refused: its pickle names the Python global '{}', which a tensor checkpoint does not need "
             "(easel reads only tensors, dicts and numbers; nothing in the file was run): convert it to .safetensors "
             "where you trust it, or get the weights in a safe format",
             label_, printable(name));
    }
    [[noreturn]] void refuse_call(uint32_t fn, const std::string& what) const {
        const Node& n = node(fn);
        fail(ErrorKind::InvalidInput, "'{}' is refused: {} on {}{} (not a tensor checkpoint's content; nothing in the file was run)",
             label_, what, kind_name(n.kind),
             n.kind == K::Global || n.kind == K::Object ? " '" + printable(n.s) + "'" : std::string());
    }

    const Node& node(uint32_t i) const { return out_.nodes[i]; }
    Node& node(uint32_t i) { return out_.nodes[i]; }

    uint32_t make(K k) {
        if (out_.nodes.size() >= kMaxNodes) bad(fmt::format("more than {} pickled values", kMaxNodes));
        out_.nodes.emplace_back();
        out_.nodes.back().kind = k;
        return (uint32_t)(out_.nodes.size() - 1);
    }
    uint32_t make_int(int64_t v) {
        uint32_t n = make(K::Int);
        node(n).i = v;
        return n;
    }
    uint32_t make_bool(bool v) {
        uint32_t n = make(K::Bool);
        node(n).b = v;
        return n;
    }
    uint32_t make_float(double v) {
        uint32_t n = make(K::Float);
        node(n).f = v;
        return n;
    }
    uint32_t make_str(K k, std::string s) {
        uint32_t n = make(k);
        node(n).s = std::move(s);
        return n;
    }
    uint32_t make_seq(K k, std::vector<uint32_t> items) {
        uint32_t n = make(k);
        node(n).items = std::move(items);
        return n;
    }
    // LONG1 / LONG4 bytes (little-endian two's complement): an Int when it fits 64 bits.
    uint32_t make_long(std::span<const uint8_t> b) {
        if (b.size() <= 8) {
            uint64_t v = 0;
            for (size_t k = 0; k < b.size(); ++k) v |= (uint64_t)b[k] << (8 * k);
            if (!b.empty() && b.size() < 8 && (b.back() & 0x80)) v |= ~0ull << (8 * b.size());  // sign-extend
            return make_int((int64_t)v);
        }
        return make_str(K::BigInt, as_string(b));
    }

    void push(uint32_t n) { stack_.push_back(n); }
    void need(size_t n, const char* op) const {
        const size_t floor = marks_.empty() ? 0 : marks_.back();
        if (stack_.size() < floor + n) bad(fmt::format("{} with too few values on the stack", op));
    }
    uint32_t top() const {
        if (stack_.empty() || (!marks_.empty() && marks_.back() >= stack_.size())) bad("an opcode needs a value but the stack is empty");
        return stack_.back();
    }
    uint32_t pop() {
        const uint32_t v = top();
        stack_.pop_back();
        return v;
    }
    void pop_mark() {
        if (marks_.empty()) bad("POP_MARK without a MARK");
        stack_.resize(marks_.back());
        marks_.pop_back();
    }
    std::vector<uint32_t> pop_to_mark() {
        if (marks_.empty()) bad("an opcode needs a MARK that is not there");
        const size_t m = marks_.back();
        marks_.pop_back();
        std::vector<uint32_t> items(stack_.begin() + (ptrdiff_t)m, stack_.end());
        stack_.resize(m);
        return items;
    }

    std::span<const uint8_t> take(uint64_t n) {
        if (n > d_.size() - pos_) bad(fmt::format("a value of {} bytes runs past the end of the pickle (truncated file)", n));
        auto s = d_.subspan(pos_, (size_t)n);
        pos_ += (size_t)n;
        return s;
    }
    uint64_t le(int n) {
        uint64_t v = 0;
        auto b = take((uint64_t)n);
        for (int k = 0; k < n; ++k) v |= (uint64_t)b[(size_t)k] << (8 * k);
        return v;
    }
    uint64_t signed_len(int n) {
        const uint64_t v = le(n);
        if (v & 0x80000000ull) bad("a negative length");
        return v;
    }
    std::string line() {
        const size_t start = pos_;
        while (pos_ < d_.size() && d_[pos_] != '\n') ++pos_;
        if (pos_ >= d_.size()) bad("a text argument without its newline (truncated file)");
        std::string s((const char*)d_.data() + start, pos_ - start);
        ++pos_;
        return s;
    }
    static std::string as_string(std::span<const uint8_t> b) { return std::string((const char*)b.data(), b.size()); }
    std::string utf8(std::span<const uint8_t> b) const {
        // CPython's BINUNICODE decoding refuses invalid UTF-8 (keys must be text); this checks the
        // byte structure (lead byte and continuation bytes).
        size_t i = 0;
        while (i < b.size()) {
            const uint8_t c = b[i];
            const size_t n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 4;
            if (n == 4 || n >= b.size() - i) {
                if (n != 0) bad("a string that is not valid UTF-8");
            }
            for (size_t k = 1; k <= n; ++k)
                if ((b[i + k] & 0xC0) != 0x80) bad("a string that is not valid UTF-8");
            i += n + 1;
        }
        return as_string(b);
    }
    int64_t parse_decimal(const std::string& s, const char* op) const {
        if (s.empty() || s.size() > 20) bad(fmt::format("{} '{}' is not a 64-bit integer", op, printable(s)));
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (*end || errno == ERANGE) bad(fmt::format("{} '{}' is not a 64-bit integer", op, printable(s)));
        return v;
    }
    uint64_t parse_index(const std::string& s, const char* op) const {
        const int64_t v = parse_decimal(s, op);
        if (v < 0) bad(fmt::format("{} with a negative memo index", op));
        return (uint64_t)v;
    }
    // Protocol 0 STRING: a Python repr in quotes, with backslash escapes.
    std::string unquote(const std::string& s) const {
        if (s.size() < 2 || (s[0] != '\'' && s[0] != '"') || s.back() != s[0]) bad("STRING argument is not quoted");
        const std::string body = s.substr(1, s.size() - 2);
        std::string r;
        for (size_t i = 0; i < body.size(); ++i) {
            if (body[i] != '\\') {
                r += body[i];
                continue;
            }
            if (++i >= body.size()) bad("STRING ends in a backslash");
            switch (const char c = body[i]) {
                case 'n': r += '\n'; break;
                case 't': r += '\t'; break;
                case 'r': r += '\r'; break;
                case '\\': r += '\\'; break;
                case '\'': r += '\''; break;
                case '"': r += '"'; break;
                case 'x': {
                    if (i + 2 >= body.size()) bad("STRING with a short \\x escape");
                    const std::string hex = body.substr(i + 1, 2);
                    char* end = nullptr;
                    const long v = std::strtol(hex.c_str(), &end, 16);
                    if (hex.size() != 2 || *end) bad("STRING with a bad \\x escape");
                    r += (char)v;
                    i += 2;
                    break;
                }
                default: r += '\\'; r += c;
            }
        }
        return r;
    }
    // Protocol 0 UNICODE: raw-unicode-escape (latin-1 bytes, \uXXXX and \UXXXXXXXX escapes).
    std::string raw_unicode_escape(const std::string& s) const {
        std::string r;
        for (size_t i = 0; i < s.size(); ++i) {
            const unsigned char c = (unsigned char)s[i];
            if (c == '\\' && i + 1 < s.size() && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
                const size_t n = s[i + 1] == 'u' ? 4 : 8;
                if (i + 2 + n > s.size()) bad("UNICODE with a short escape");
                char* end = nullptr;
                const std::string hex = s.substr(i + 2, n);
                const unsigned long cp = std::strtoul(hex.c_str(), &end, 16);
                if (*end || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) bad("UNICODE with a bad escape");
                put_utf8(r, (uint32_t)cp);
                i += 1 + n;
            } else {
                put_utf8(r, c);
            }
        }
        return r;
    }

    void get(uint64_t idx) {
        auto it = memo_.find(idx);
        if (it == memo_.end()) bad(fmt::format("GET of memo entry {}, which was never stored", idx));
        push(it->second);
    }
    void put(uint64_t idx) {
        if (memo_.size() >= kMaxNodes && !memo_.count(idx)) bad("too many memo entries");
        memo_[idx] = top();
    }

    void append_to(uint32_t target, const std::vector<uint32_t>& items) {
        Node& t = node(target);
        if (t.kind != K::List) refuse_call(target, "APPEND");
        t.items.insert(t.items.end(), items.begin(), items.end());
        if (t.items.size() > kMaxNodes) bad("a list longer than the pickle can hold");
    }
    void set_items(uint32_t target, const std::vector<uint32_t>& kv) {
        Node& t = node(target);
        if (t.kind != K::Dict) refuse_call(target, "SETITEM");
        t.items.insert(t.items.end(), kv.begin(), kv.end());
        if (t.items.size() > kMaxNodes) bad("a dict larger than the pickle can hold");
    }

    uint32_t global(std::string mod, const std::string& name) {
        mod = fold_module(mod);
        const std::string full = mod + "." + name;
        const auto& a = allowed_globals();
        if (!a.count(full)) {
            if (mod.rfind("__torch__", 0) == 0)
                fail(ErrorKind::InvalidInput,
                     "'{}' is a TorchScript archive (torch.jit.save; its pickle names '{}'), not a state dict: load it in PyTorch, "
                     "save model.state_dict() and convert that to .safetensors",
                     label_, printable(full));
            refuse_global(full);
        }
        uint32_t n = make(K::Global);
        node(n).s = full;
        return n;
    }
    const GlobalInfo* global_info(uint32_t n) const {
        if (node(n).kind != K::Global) return nullptr;
        auto it = allowed_globals().find(node(n).s);
        return it == allowed_globals().end() ? nullptr : &it->second;
    }

    const Node& arg(const Node& args, size_t k) const { return node(args.items[k]); }
    int64_t int_arg(const Node& args, size_t k, const char* what) const {
        const Node& a = arg(args, k);
        if (a.kind == K::Bool) return a.b;
        if (a.kind != K::Int) bad(fmt::format("{} is {}, not an integer", what, kind_name(a.kind)));
        return a.i;
    }
    std::vector<int64_t> ints_arg(const Node& args, size_t k, const char* what) const {
        const Node& a = arg(args, k);
        if (a.kind != K::Tuple && a.kind != K::List) bad(fmt::format("tensor {} is {}, not a tuple", what, kind_name(a.kind)));
        if (a.items.size() > detail::kMaxDims) bad(fmt::format("a tensor with {} dimensions (at most {})", a.items.size(), detail::kMaxDims));
        std::vector<int64_t> v;
        for (uint32_t x : a.items) {
            const Node& e = node(x);
            if (e.kind != K::Int || e.i < 0) bad(fmt::format("tensor {} holds {} (not a non-negative integer)", what, e.kind == K::Int ? "a negative value" : kind_name(e.kind)));
            v.push_back(e.i);
        }
        return v;
    }

    uint32_t rebuild_tensor(const Node& args, bool v2) {
        if (args.items.size() < 4 || args.items.size() > (v2 ? 7u : 4u))
            bad(fmt::format("{} with {} arguments", v2 ? "_rebuild_tensor_v2" : "_rebuild_tensor", args.items.size()));
        const uint32_t st = args.items[0];
        if (node(st).kind != K::Storage) bad(fmt::format("a tensor whose storage is {}", kind_name(node(st).kind)));
        const int64_t off = int_arg(args, 1, "a tensor's storage offset");
        if (off < 0) bad("a negative storage offset");
        auto size = ints_arg(args, 2, "size");
        auto stride = ints_arg(args, 3, "stride");
        if (size.size() != stride.size()) bad(fmt::format("a tensor with {} sizes but {} strides", size.size(), stride.size()));
        uint32_t t = make(K::Tensor);
        Node& n = node(t);
        n.items = {st};
        n.i = off;
        n.dtype = node(st).dtype;
        n.size = std::move(size);
        n.stride = std::move(stride);
        return t;
    }

    uint32_t call(const GlobalInfo& g, uint32_t fn, uint32_t args_n) {
        const Node& args = node(args_n);
        const size_t na = args.items.size();
        switch (g.id) {
            case G::OrderedDict: {
                if (na == 0) return make(K::Dict);
                if (na == 1 && (arg(args, 0).kind == K::List || arg(args, 0).kind == K::Tuple)) {
                    std::vector<uint32_t> kv;
                    for (uint32_t p : arg(args, 0).items) {
                        const Node& pair = node(p);
                        if ((pair.kind != K::Tuple && pair.kind != K::List) || pair.items.size() != 2) bad("OrderedDict from items that are not pairs");
                        kv.push_back(pair.items[0]);
                        kv.push_back(pair.items[1]);
                    }
                    return make_seq(K::Dict, std::move(kv));
                }
                if (na == 1 && arg(args, 0).kind == K::Dict) return make_seq(K::Dict, arg(args, 0).items);
                bad("OrderedDict called with arguments a state dict never has");
            }
            case G::RebuildTensorV2: return rebuild_tensor(args, true);
            case G::RebuildTensor: return rebuild_tensor(args, false);
            case G::RebuildParameter:
            case G::RebuildParameterWithState: {
                if (na < 1 || node(args.items[0]).kind != K::Tensor) bad("_rebuild_parameter without a tensor");
                return args.items[0];
            }
            case G::RebuildFromTypeV2: {
                // (func, new_type, args, state): the tensor subclass path of Tensor.__reduce_ex__
                if (na != 4) bad("_rebuild_from_type_v2 with a wrong argument count");
                const GlobalInfo* f = global_info(args.items[0]);
                const GlobalInfo* ty = global_info(args.items[1]);
                if (!f || (f->id != G::RebuildTensorV2 && f->id != G::RebuildTensor && f->id != G::RebuildParameter))
                    refuse_call(args.items[0], "_rebuild_from_type_v2");
                if (!ty || (ty->id != G::TorchTensor && ty->id != G::TorchParameter)) refuse_call(args.items[1], "_rebuild_from_type_v2 with the type");
                if (arg(args, 2).kind != K::Tuple) bad("_rebuild_from_type_v2 arguments are not a tuple");
                return call(*f, args.items[0], args.items[2]);
            }
            case G::TorchSize: {
                if (na != 1 || (arg(args, 0).kind != K::Tuple && arg(args, 0).kind != K::List)) bad("torch.Size of something that is not a tuple");
                return make_seq(K::Tuple, arg(args, 0).items);
            }
            case G::Set:
            case G::FrozenSet: {
                if (na == 0) return make(K::List);
                if (na == 1 && (arg(args, 0).kind == K::List || arg(args, 0).kind == K::Tuple)) return make_seq(K::List, arg(args, 0).items);
                bad("set() of something that is not a list");
            }
            case G::CodecsEncode: {
                // protocol 2 pickles bytes as _codecs.encode(text, 'latin1')
                if (na != 2 || arg(args, 0).kind != K::String || arg(args, 1).kind != K::String) bad("_codecs.encode with unexpected arguments");
                const std::string enc = arg(args, 1).s;
                if (enc != "latin1" && enc != "latin-1") bad(fmt::format("_codecs.encode to '{}' (only latin1 occurs)", printable(enc)));
                std::string out;
                const std::string& s = arg(args, 0).s;
                for (size_t i = 0; i < s.size();) {
                    const uint8_t c = (uint8_t)s[i];
                    if (c < 0x80) { out += (char)c; ++i; continue; }
                    if ((c >> 5) == 6 && i + 1 < s.size()) {
                        const uint32_t cp = ((c & 0x1Fu) << 6) | ((uint8_t)s[i + 1] & 0x3Fu);
                        if (cp < 256) { out += (char)cp; i += 2; continue; }
                    }
                    bad("_codecs.encode of text outside latin1");
                }
                return make_str(K::Bytes, std::move(out));
            }
            case G::NumpyDtype: {
                if (na < 1 || arg(args, 0).kind != K::String) bad("numpy.dtype without a type string");
                uint32_t o = make(K::Object);
                node(o).s = "numpy.dtype";
                node(o).location = node(args_n).items.empty() ? "" : node(node(args_n).items[0]).s;  // the type code ('f8', 'i8' ...)
                return o;
            }
            case G::NumpyScalar: return numpy_scalar(args);
            case G::InertClass:
            case G::TorchTensor:
            case G::TorchParameter:
            case G::StorageType:
            case G::TorchDtype: break;
        }
        refuse_call(fn, "a call (REDUCE)");
    }

    // numpy.core.multiarray.scalar(dtype, bytes): a number when the dtype is one.
    uint32_t numpy_scalar(const Node& args) {
        if (args.items.size() != 2 || arg(args, 0).kind != K::Object || arg(args, 0).s != "numpy.dtype" || arg(args, 1).kind != K::Bytes)
            bad("numpy scalar with unexpected arguments");
        const std::string code = arg(args, 0).location;
        const std::string& b = arg(args, 1).s;
        const std::string big = arg(args, 0).size.empty() ? "" : ">";
        if (!big.empty()) bad("a big-endian numpy scalar");
        auto rd = [&](auto v) {
            if (b.size() != sizeof(v)) bad(fmt::format("numpy scalar of type '{}' with {} bytes", printable(code), b.size()));
            std::memcpy(&v, b.data(), sizeof(v));
            return v;
        };
        if (code == "f8") return make_float(rd(double{}));
        if (code == "f4") return make_float(rd(float{}));
        if (code == "i8") return make_int(rd(int64_t{}));
        if (code == "i4") return make_int(rd(int32_t{}));
        if (code == "i2") return make_int(rd(int16_t{}));
        if (code == "i1") return make_int(rd(int8_t{}));
        if (code == "u1") return make_int(rd(uint8_t{}));
        if (code == "u2") return make_int(rd(uint16_t{}));
        if (code == "u4") return make_int(rd(uint32_t{}));
        if (code == "b1") return make_bool(rd(uint8_t{}) != 0);
        uint32_t o = make(K::Object);  // another numpy type: kept as an inert value
        node(o).s = "numpy scalar '" + printable(code) + "'";
        return o;
    }

    uint32_t reduce(uint32_t fn, uint32_t args) {
        const GlobalInfo* g = global_info(fn);
        if (!g) refuse_call(fn, "a call (REDUCE)");
        if (node(args).kind != K::Tuple) bad("REDUCE arguments are not a tuple");
        return call(*g, fn, args);
    }

    uint32_t newobj(uint32_t cls, uint32_t args) {
        const GlobalInfo* g = global_info(cls);
        if (!g) refuse_call(cls, "object creation (NEWOBJ)");
        if (node(args).kind != K::Tuple) bad("NEWOBJ arguments are not a tuple");
        if (g->id == G::OrderedDict) return make(K::Dict);
        if (g->id == G::InertClass) {
            uint32_t o = make(K::Object);
            node(o).s = node(cls).s;
            return o;
        }
        refuse_call(cls, "object creation (NEWOBJ)");
    }

    void build(uint32_t target, uint32_t state) {
        Node& t = node(target);
        const Node& s = node(state);
        switch (t.kind) {
            case K::Object:
                if (t.s == "numpy.dtype") {
                    // state (version, byte order, ...): keep the byte order ('>' = big-endian)
                    if (s.kind == K::Tuple && s.items.size() >= 2 && node(s.items[1]).kind == K::String && node(s.items[1]).s == ">")
                        t.size = {1};
                    return;
                }
                t.items.push_back(state);  // an inert object keeps its state as data; it is never used
                return;
            case K::Dict:
                // OrderedDict.__reduce__ passes the instance __dict__ (state_dict._metadata)
                if (s.kind == K::Dict || s.kind == K::None) return;
                break;
            case K::Tensor:
                if ((s.kind == K::Dict && s.items.empty()) || s.kind == K::None) return;
                break;
            default: break;
        }
        refuse_call(target, "BUILD (setting object state)");
    }

    uint32_t persistent(uint32_t pid) {
        const Node& p = node(pid);
        if (p.kind != K::Tuple || p.items.size() < 5 || p.items.size() > 6 || node(p.items[0]).kind != K::String || node(p.items[0]).s != "storage")
            bad("a persistent id that is not a PyTorch storage ('storage', type, key, location, size)");
        const GlobalInfo* g = global_info(p.items[1]);
        if (!g || g->id != G::StorageType) refuse_call(p.items[1], "a storage of type");
        const Node& key = node(p.items[2]);
        const Node& loc = node(p.items[3]);
        const Node& numel = node(p.items[4]);
        if (key.kind != K::String || key.s.empty() || key.s.size() > 64) bad("a storage key that is not a short string");
        if (loc.kind != K::String) bad("a storage location that is not a string");
        if (numel.kind != K::Int || numel.i < 0) bad("a storage size that is not a non-negative integer");
        if (p.items.size() == 6 && node(p.items[5]).kind != K::None)
            bad("a storage view (legacy view metadata), which only files from PyTorch 0.3 and older hold: re-save the file");
        // copied before make(): it may reallocate the node array that p, key, loc and numel point into
        std::string key_s = key.s, loc_s = loc.s;
        const int64_t n_el = numel.i;
        const DType dt = g->dtype;
        uint32_t s = make(K::Storage);
        Node& n = node(s);
        n.s = std::move(key_s);
        n.location = std::move(loc_s);
        n.i = n_el;
        n.dtype = dt;
        return s;
    }
};

std::string scalar_text(const Node& n) {
    switch (n.kind) {
        case K::Int: return std::to_string(n.i);
        case K::Bool: return n.b ? "true" : "false";
        case K::Float: return fmt::format("{}", n.f);
        case K::String: return printable(n.s, 200);
        default: return {};
    }
}

}  // namespace

Unpickled unpickle(std::span<const uint8_t> data, const std::string& label) { return Machine(data, label).run(); }

StateDict select_state_dict(const Unpickled& u, const std::string& label) {
    StateDict out;
    const Node& root = u.at(u.root);
    if (root.kind != K::Dict)
        fail(ErrorKind::InvalidInput, "'{}' holds {}, not a state dict (a dict of tensors): save model.state_dict()", label,
             kind_name(root.kind));
    std::set<std::string> names;
    // Depth-first collection; `seen` guards against cycles a hostile file builds through the memo.
    std::function<void(uint32_t, const std::string&, int)> collect = [&](uint32_t ni, const std::string& prefix, int depth) {
        if (depth > kMaxNesting)
            fail(ErrorKind::InvalidInput, "'{}': the checkpoint nests containers deeper than {} levels (or in a cycle): not a state dict", label,
                 kMaxNesting);
        const Node& n = u.at(ni);
        auto visit = [&](const std::string& name, uint32_t vi) {
            const Node& v = u.at(vi);
            if (v.kind == K::Tensor) {
                if (!names.insert(name).second)
                    fail(ErrorKind::InvalidInput, "'{}': the tensor name '{}' occurs twice", label, printable(name));
                if (out.tensors.size() >= kMaxNodes) fail(ErrorKind::InvalidInput, "'{}': too many tensors", label);
                out.tensors.push_back({name, vi});
            } else if (v.kind == K::Dict || v.kind == K::List || v.kind == K::Tuple) {
                collect(vi, name + ".", depth + 1);
            }
        };
        if (n.kind == K::Dict) {
            for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
                const Node& key = u.at(n.items[k]);
                if (key.kind == K::String) visit(prefix + key.s, n.items[k + 1]);
                else if (key.kind == K::Int) visit(prefix + std::to_string(key.i), n.items[k + 1]);
            }
        } else {
            for (size_t k = 0; k < n.items.size(); ++k) visit(prefix + std::to_string(k), n.items[k]);
        }
    };
    // Which value of the root dict holds the weights.
    static const char* wrappers[] = {"params_ema", "params", "state_dict", "model", "module", "model_state_dict", "net"};
    std::map<std::string, uint32_t> by_key;
    for (size_t k = 0; k + 1 < root.items.size(); k += 2) {
        const Node& key = u.at(root.items[k]);
        if (key.kind != K::String) continue;
        by_key.emplace(key.s, root.items[k + 1]);
        const std::string t = scalar_text(u.at(root.items[k + 1]));
        if (!t.empty()) out.scalars.emplace_back(key.s, t);
    }
    bool root_has_tensors = false;
    for (size_t k = 1; k < root.items.size(); k += 2)
        if (u.at(root.items[k]).kind == K::Tensor) root_has_tensors = true;
    if (!root_has_tensors) {
        for (const char* w : wrappers) {
            auto it = by_key.find(w);
            if (it == by_key.end() || u.at(it->second).kind != K::Dict) continue;
            names.clear();
            out.tensors.clear();
            collect(it->second, "", 1);
            if (out.tensors.empty()) continue;
            if (out.wrapper.empty()) out.wrapper = w;
            break;
        }
        if (!out.wrapper.empty())
            for (const char* w : wrappers)
                if (w != out.wrapper && by_key.count(w) && u.at(by_key[w]).kind == K::Dict) out.unused_wrappers.push_back(w);
    }
    if (out.wrapper.empty()) {
        names.clear();
        out.tensors.clear();
        collect(u.root, "", 0);
    }
    if (out.tensors.empty()) fail(ErrorKind::InvalidInput, "'{}' holds no tensors: not a weight file", label);
    return out;
}

}  // namespace easel::io::pickle
