// Test helper: writes PyTorch checkpoints as torch.save does (pickle protocol 2, storages as
// persistent ids), in the zip format or the legacy one, so tests can turn any safetensors fixture
// into a .pth / .ckpt at run time. Opcodes: CPython Lib/pickletools.py; layout: torch/serialization.py.
// (tools/make-malformed/pytorch_files.py writes the committed files with CPython's pickler.)
#pragma once

#include "io/weight_index.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace easel::test {

/// One tensor to save: its bytes in row-major order.
struct TorchTensor {
    std::string name;
    io::DType dtype = io::DType::F32;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

/// Every tensor of an opened index, as stored (dtypes a storage type exists for).
inline std::vector<TorchTensor> tensors_of(const io::WeightIndex& wi) {
    std::vector<TorchTensor> r;
    for (const auto& t : wi.tensors()) {
        auto b = wi.bytes(t);
        r.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(b.begin(), b.end())});
    }
    return r;
}

namespace torch_writer_detail {

inline void u32(std::vector<uint8_t>& o, uint32_t v) {
    for (int k = 0; k < 4; ++k) o.push_back((uint8_t)(v >> (8 * k)));
}
inline void u16(std::vector<uint8_t>& o, uint32_t v) {
    o.push_back((uint8_t)v);
    o.push_back((uint8_t)(v >> 8));
}
inline void u64(std::vector<uint8_t>& o, uint64_t v) {
    for (int k = 0; k < 8; ++k) o.push_back((uint8_t)(v >> (8 * k)));
}

/// Pickle protocol 2 writer with the handful of opcodes torch.save's output uses.
struct Pickle {
    std::vector<uint8_t> b;
    Pickle() {
        b.push_back(0x80);  // PROTO 2
        b.push_back(0x02);
    }
    void op(char c) { b.push_back((uint8_t)c); }
    void str(const std::string& s) {
        op('X');
        u32(b, (uint32_t)s.size());
        b.insert(b.end(), s.begin(), s.end());
    }
    void integer(int64_t v) {
        if (v >= 0 && v < 256) {
            op('K');
            b.push_back((uint8_t)v);
        } else if (v >= INT32_MIN && v <= INT32_MAX) {
            op('J');
            u32(b, (uint32_t)(int32_t)v);
        } else {
            b.push_back(0x8a);
            b.push_back(8);
            u64(b, (uint64_t)v);
        }
    }
    void global(const std::string& mod, const std::string& name) {
        op('c');
        b.insert(b.end(), mod.begin(), mod.end());
        op('\n');
        b.insert(b.end(), name.begin(), name.end());
        op('\n');
    }
    void ints(const std::vector<int64_t>& v) {
        op('(');
        for (int64_t x : v) integer(x);
        op('t');
    }
    void stop() { op('.'); }
};

inline const char* storage_name(io::DType d) {
    switch (d) {
        case io::DType::F64: return "DoubleStorage";
        case io::DType::F32: return "FloatStorage";
        case io::DType::F16: return "HalfStorage";
        case io::DType::BF16: return "BFloat16Storage";
        case io::DType::I64: return "LongStorage";
        case io::DType::I32: return "IntStorage";
        case io::DType::I16: return "ShortStorage";
        case io::DType::I8: return "CharStorage";
        case io::DType::U8: return "ByteStorage";
        case io::DType::BOOL: return "BoolStorage";
        default: return "ByteStorage";
    }
}

inline size_t elem(io::DType d) {
    switch (d) {
        case io::DType::F64: case io::DType::I64: return 8;
        case io::DType::F32: case io::DType::I32: return 4;
        case io::DType::F16: case io::DType::BF16: case io::DType::I16: return 2;
        default: return 1;
    }
}

/// The object pickle: {wrapper: OrderedDict(tensors)} (or the OrderedDict itself), storage i = key "i".
inline std::vector<uint8_t> object_pickle(const std::vector<TorchTensor>& ts, const std::string& wrapper, bool legacy,
                                          const std::vector<std::pair<std::string, int64_t>>& scalars) {
    Pickle p;
    if (!wrapper.empty()) {
        p.op('}');
        p.op('(');
        for (auto& [k, v] : scalars) {
            p.str(k);
            p.integer(v);
        }
        p.str(wrapper);
    }
    p.global("collections", "OrderedDict");
    p.op(')');
    p.op('R');
    p.op('(');
    for (size_t i = 0; i < ts.size(); ++i) {
        const auto& t = ts[i];
        p.str(t.name);
        p.global("torch._utils", "_rebuild_tensor_v2");
        p.op('(');
        p.op('(');
        p.str("storage");
        p.global("torch", storage_name(t.dtype));
        p.str(legacy ? std::to_string(1000 + i) : std::to_string(i));
        p.str("cpu");
        p.integer((int64_t)(t.bytes.size() / elem(t.dtype)));
        if (legacy) p.op('N');
        p.op('t');
        p.op('Q');
        p.integer(0);
        p.ints(t.shape);
        std::vector<int64_t> stride(t.shape.size());
        int64_t acc = 1;
        for (size_t k = t.shape.size(); k-- > 0;) {
            stride[k] = acc;
            acc *= t.shape[k];
        }
        p.ints(stride);
        p.b.push_back(0x89);  // requires_grad False
        p.global("collections", "OrderedDict");
        p.op(')');
        p.op('R');
        p.op('t');
        p.op('R');
    }
    p.op('u');
    if (!wrapper.empty()) {
        p.op('u');
    }
    p.stop();
    return p.b;
}

}  // namespace torch_writer_detail

/// torch.save(obj) bytes: obj = {wrapper: OrderedDict(tensors), scalars...} when `wrapper` is
/// given, else the OrderedDict; zip format (stored entries under "archive/", data aligned to 64
/// bytes as PyTorchStreamWriter does) or the legacy format.
inline std::vector<uint8_t> torch_save(const std::vector<TorchTensor>& ts, const std::string& wrapper = "", bool legacy = false,
                                       const std::vector<std::pair<std::string, int64_t>>& scalars = {}) {
    using namespace torch_writer_detail;
    const auto pkl = object_pickle(ts, wrapper, legacy, scalars);
    std::vector<uint8_t> out;
    out.reserve(pkl.size() + 4096);  // (also keeps GCC 12's -Warray-bounds false positive on the inserts below quiet)
    if (legacy) {
        const uint8_t magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
        out.assign(magic, magic + sizeof(magic));
        const uint8_t proto[] = {0x80, 0x02, 'M', 0xe9, 0x03, '.'};
        out.insert(out.end(), proto, proto + sizeof(proto));
        Pickle info;
        info.op('}');
        info.op('(');
        info.str("protocol_version");
        info.integer(1001);
        info.str("little_endian");
        info.b.push_back(0x88);
        info.op('u');
        info.stop();
        out.insert(out.end(), info.b.begin(), info.b.end());
        out.insert(out.end(), pkl.begin(), pkl.end());
        Pickle keys;  // sorted as strings: "1000", "1001", ... sort like numbers here
        keys.op(']');
        keys.op('(');
        for (size_t i = 0; i < ts.size(); ++i) keys.str(std::to_string(1000 + i));
        keys.op('e');
        keys.stop();
        out.insert(out.end(), keys.b.begin(), keys.b.end());
        for (const auto& t : ts) {
            u64(out, t.bytes.size() / elem(t.dtype));
            out.insert(out.end(), t.bytes.begin(), t.bytes.end());
        }
        return out;
    }
    std::vector<std::pair<std::string, std::vector<uint8_t>>> entries;
    entries.push_back({"archive/data.pkl", pkl});
    entries.push_back({"archive/byteorder", {'l', 'i', 't', 't', 'l', 'e'}});
    for (size_t i = 0; i < ts.size(); ++i) entries.push_back({std::string("archive/data/") + std::to_string(i), ts[i].bytes});
    entries.push_back({"archive/version", {'3', '\n'}});
    std::vector<uint8_t> central;
    for (auto& [name, data] : entries) {
        const uint32_t off = (uint32_t)out.size();
        const size_t pad = (64 - (out.size() + 30 + name.size() + 4) % 64) % 64;
        u32(out, 0x04034b50);
        u16(out, 20); u16(out, 0); u16(out, 0); u16(out, 0); u16(out, 0x21);
        u32(out, 0);  // crc (not checked by the reader)
        u32(out, (uint32_t)data.size());
        u32(out, (uint32_t)data.size());
        u16(out, (uint32_t)name.size());
        u16(out, (uint32_t)(4 + pad));
        out.insert(out.end(), name.begin(), name.end());
        u16(out, 0x4246);
        u16(out, (uint32_t)pad);
        out.insert(out.end(), pad, 'Z');
        out.insert(out.end(), data.begin(), data.end());
        u32(central, 0x02014b50);
        u16(central, 20); u16(central, 20); u16(central, 0); u16(central, 0); u16(central, 0); u16(central, 0x21);
        u32(central, 0);
        u32(central, (uint32_t)data.size());
        u32(central, (uint32_t)data.size());
        u16(central, (uint32_t)name.size());
        u16(central, 0); u16(central, 0); u16(central, 0); u16(central, 0);
        u32(central, 0);
        u32(central, off);
        central.insert(central.end(), name.begin(), name.end());
    }
    const uint32_t cd_off = (uint32_t)out.size();
    out.insert(out.end(), central.begin(), central.end());
    u32(out, 0x06054b50);
    u16(out, 0); u16(out, 0);
    u16(out, (uint32_t)entries.size());
    u16(out, (uint32_t)entries.size());
    u32(out, (uint32_t)central.size());
    u32(out, cd_off);
    u16(out, 0);
    return out;
}

/// Writes torch_save(...) to `path`.
inline void torch_save_file(const std::filesystem::path& path, const std::vector<TorchTensor>& ts, const std::string& wrapper = "",
                            bool legacy = false, const std::vector<std::pair<std::string, int64_t>>& scalars = {}) {
    const auto b = torch_save(ts, wrapper, legacy, scalars);
    std::ofstream f(path, std::ios::binary);
    f.write((const char*)b.data(), (std::streamsize)b.size());
}

}  // namespace easel::test
