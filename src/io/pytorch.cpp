// PyTorch checkpoints (torch.save): the zip format (PyTorch >= 1.6) and the legacy pickle
// stream, read through the restricted unpickler (pickle.h); see readers.h.
//
// Zip format (torch/serialization.py _save, caffe2 PyTorchStreamWriter): a zip archive whose
// entries are <archive>/data.pkl (the pickled object; storages as persistent ids
// ('storage', type, key, location, numel)), <archive>/data/<key> (each storage's raw bytes,
// little-endian, stored uncompressed), <archive>/version, <archive>/byteorder ("little"; absent in
// files from before PyTorch 2.1). The zip structure: PKWARE APPNOTE.TXT (end of central directory,
// ZIP64 end record and locator, central directory headers, the ZIP64 extra field 0x0001, local
// headers). Storages are used where they lie in the file (memory-mapped, no copy); entries a
// re-packing tool deflated (method 8; e.g. the realesr-animevideov3 release) are inflated with zlib
// into the side buffer, their CRC-32 checked.
//
// Legacy format (_legacy_save): five pickles in a row - the magic number 0x1950a86a20f9469cfc6c,
// the protocol version 1001, sys_info {protocol_version, little_endian, type_sizes}, the object,
// the list of storage keys - then for each key in that order an int64 element count and the
// storage's bytes.
#include "core/error.h"
#include "io/pickle.h"
#include "io/readers.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <map>

namespace easel::io::detail {

namespace {

using pickle::Node;
using K = Node::Kind;

std::string printable(const std::string& s) {
    std::string r;
    for (char c : s.substr(0, 120)) r += ((unsigned char)c < 0x20 || c == 0x7f) ? '?' : c;
    if (s.size() > 120) r += "...";
    return r;
}

uint64_t rd(std::span<const uint8_t> d, uint64_t at, int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= (uint64_t)d[(size_t)at + (size_t)k] << (8 * k);
    return v;
}

/// One entry of the zip's central directory.
struct ZipEntry {
    std::string name;
    uint64_t data = 0;   ///< absolute offset of the stored bytes
    uint64_t size = 0;   ///< stored (compressed) bytes
    uint64_t usize = 0;  ///< bytes once inflated
    uint32_t crc = 0;    ///< CRC-32 of the inflated bytes
    uint16_t method = 0; ///< 0 stored, 8 deflate
};

/// Reads the central directory; every entry's bytes are checked to lie inside the file.
std::vector<ZipEntry> read_zip(std::span<const uint8_t> d, const std::string& label) {
    auto bad = [&](const std::string& what) -> void {
        fail(ErrorKind::InvalidInput, "'{}' is not a readable PyTorch zip checkpoint: {}", label, what);
    };
    const uint64_t n = d.size();
    if (n < 22) bad("shorter than a zip end record (truncated file)");
    // End of central directory: the last signature within the final 64 KiB + 22 bytes.
    uint64_t eocd = UINT64_MAX;
    const uint64_t lowest = n > 22 + 65535 ? n - 22 - 65535 : 0;
    for (uint64_t p = n - 22 + 1; p-- > lowest;)
        if (rd(d, p, 4) == 0x06054b50 && p + 22 + rd(d, p + 20, 2) == n) {
            eocd = p;
            break;
        }
    if (eocd == UINT64_MAX) bad("no zip end-of-central-directory record (truncated or not a zip file)");
    uint64_t entries = rd(d, eocd + 10, 2), cd_size = rd(d, eocd + 12, 4), cd_off = rd(d, eocd + 16, 4);
    if (rd(d, eocd + 4, 2) != 0 || rd(d, eocd + 6, 2) != 0) bad("a multi-disk zip archive");
    if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {
        // ZIP64: locator right before the end record, pointing at the ZIP64 end record.
        if (eocd < 20 || rd(d, eocd - 20, 4) != 0x07064b50) bad("a ZIP64 archive without its ZIP64 locator");
        const uint64_t z = rd(d, eocd - 20 + 8, 8);
        if (n < 56 || z > n - 56 || rd(d, z, 4) != 0x06064b50) bad("the ZIP64 end record lies outside the file");
        entries = rd(d, z + 32, 8);
        cd_size = rd(d, z + 40, 8);
        cd_off = rd(d, z + 48, 8);
    }
    if (cd_off > n || cd_size > n - cd_off) bad("the central directory lies outside the file (truncated file)");
    if (entries > cd_size / 46) bad(fmt::format("{} entries do not fit a central directory of {} bytes", entries, cd_size));
    std::vector<ZipEntry> out;
    out.reserve((size_t)entries);
    uint64_t p = cd_off;
    const uint64_t end = cd_off + cd_size;
    for (uint64_t e = 0; e < entries; ++e) {
        if (end - p < 46 || rd(d, p, 4) != 0x02014b50) bad("a damaged central directory entry");
        const uint64_t flags = rd(d, p + 8, 2), method = rd(d, p + 10, 2);
        uint64_t csize = rd(d, p + 20, 4), usize = rd(d, p + 24, 4);
        const uint64_t nl = rd(d, p + 28, 2), xl = rd(d, p + 30, 2), cl = rd(d, p + 32, 2);
        uint64_t local = rd(d, p + 42, 4);
        if (end - p - 46 < nl + xl + cl) bad("a central directory entry runs past the directory");
        ZipEntry z;
        z.name.assign((const char*)d.data() + p + 46, (size_t)nl);
        // ZIP64 extended information: the fields whose 32-bit value is all ones, in order.
        for (uint64_t x = p + 46 + nl; x + 4 <= p + 46 + nl + xl;) {
            const uint64_t id = rd(d, x, 2), len = rd(d, x + 2, 2);
            if (x + 4 + len > p + 46 + nl + xl) bad("a damaged zip extra field");
            if (id == 0x0001) {
                uint64_t q = x + 4;
                auto next = [&](uint64_t& field) {
                    if (field != 0xFFFFFFFF) return;
                    if (q + 8 > x + 4 + len) bad("a short ZIP64 extra field");
                    field = rd(d, q, 8);
                    q += 8;
                };
                next(usize);
                next(csize);
                next(local);
            }
            x += 4 + len;
        }
        if (flags & 1) bad(fmt::format("entry '{}' is encrypted", printable(z.name)));
        z.method = (uint16_t)method;
        z.crc = (uint32_t)rd(d, p + 16, 4);
        z.usize = usize;
        if (local > n || n - local < 30 || rd(d, local, 4) != 0x04034b50)
            bad(fmt::format("the local header of '{}' lies outside the file or is damaged", printable(z.name)));
        const uint64_t lnl = rd(d, local + 26, 2), lxl = rd(d, local + 28, 2);
        if (n - local - 30 < lnl + lxl) bad(fmt::format("the local header of '{}' runs past the end of the file", printable(z.name)));
        if (lnl != nl || std::memcmp(d.data() + local + 30, z.name.data(), (size_t)nl) != 0)
            bad(fmt::format("the local header of '{}' names another file", printable(z.name)));
        z.data = local + 30 + lnl + lxl;
        z.size = csize;
        if (z.data > n || csize > n - z.data)
            bad(fmt::format("the data of '{}' ({} bytes) run past the end of the file (truncated file)", printable(z.name), csize));
        if (method == 0 && csize != usize) bad(fmt::format("stored entry '{}' has different stored and real sizes", printable(z.name)));
        if (method != 0 && method != 8)
            bad(fmt::format("entry '{}' uses zip compression method {} (torch.save stores, re-packing tools deflate)", printable(z.name), method));
        // deflate gains at most 1032:1 (zlib's "compression of zeros" bound)
        if (method == 8 && usize > csize * 1032 + 1024)
            bad(fmt::format("entry '{}' claims {} bytes from {} deflated ones", printable(z.name), usize, csize));
        out.push_back(std::move(z));
        p += 46 + nl + xl + cl;
    }
    return out;
}

/// Inflates a deflated entry (raw deflate, zlib windowBits -15) into dst[at, at + e.usize) and checks
/// its length and CRC-32. Throws Error(InvalidInput) naming the entry.
void inflate_entry(std::span<const uint8_t> file, const ZipEntry& e, uint8_t* dst, const std::string& label) {
    z_stream zs{};
    if (inflateInit2(&zs, -15) != Z_OK) fail(ErrorKind::Internal, "zlib inflateInit2 failed");
    uint64_t in_left = e.size, out_left = e.usize;
    const uint8_t* in = file.data() + e.data;
    uint8_t* out = dst;
    int rc = Z_OK;
    while (rc == Z_OK) {
        const uInt ci = (uInt)std::min<uint64_t>(in_left, 1u << 30), co = (uInt)std::min<uint64_t>(out_left, 1u << 30);
        zs.next_in = const_cast<Bytef*>(in);
        zs.avail_in = ci;
        zs.next_out = out;
        zs.avail_out = co;
        rc = inflate(&zs, Z_NO_FLUSH);
        in += ci - zs.avail_in;
        in_left -= ci - zs.avail_in;
        out += co - zs.avail_out;
        out_left -= co - zs.avail_out;
        if (rc == Z_OK && zs.avail_out == co && zs.avail_in == ci) rc = Z_BUF_ERROR;  // no progress
    }
    inflateEnd(&zs);
    if (rc != Z_STREAM_END || out_left != 0)
        fail(ErrorKind::InvalidInput, "'{}': the deflated zip entry '{}' is damaged or truncated (it does not inflate to its {} bytes)", label,
             printable(e.name), e.usize);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (uint64_t k = 0; k < e.usize; k += 1u << 30)
        crc = crc32(crc, dst + k, (uInt)std::min<uint64_t>(e.usize - k, 1u << 30));
    if ((uint32_t)crc != e.crc)
        fail(ErrorKind::InvalidInput, "'{}': the zip entry '{}' fails its CRC-32 check (damaged file)", label, printable(e.name));
}

/// Where a storage's bytes lie: absolute offset and available bytes, in the file or (`side`) in
/// the side buffer.
struct StorageBytes {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    bool side = false;
};

/// Bytes that tensor descriptions may reference beyond the file (strided tensors made contiguous).
struct Side {
    std::vector<uint8_t>& buf;
    uint64_t cap;
};

/// The TensorInfo of tensor node `tn` whose storage lies at `sb` in `file`.
TensorInfo make_tensor(const pickle::Unpickled& u, const pickle::FoundTensor& ft, const StorageBytes& sb, std::span<const uint8_t> file,
                       Side& side, const std::string& label) {
    const Node& t = u.at(ft.node);
    const std::string pn = printable(ft.name);
    TensorInfo ti;
    ti.name = ft.name;
    ti.dtype = t.dtype;
    ti.gtype = dtype_ggml_type(t.dtype);
    ti.shape = t.size;
    const uint64_t es = dtype_size(t.dtype);
    // Element count and the highest element index, in 128 bits: a hostile size cannot wrap.
    unsigned __int128 numel = 1, last = (unsigned __int128)(uint64_t)t.i;
    for (size_t k = 0; k < t.size.size(); ++k) {
        numel *= (uint64_t)t.size[k];
        if (numel > (unsigned __int128)INT64_MAX)
            fail(ErrorKind::InvalidInput, "'{}': tensor '{}' has a shape whose size overflows 64 bits", label, pn);
    }
    const uint64_t storage_numel = sb.bytes / es;
    if (numel == 0) {
        ti.offset = sb.offset;
        ti.side = sb.side;
        ti.nbytes = 0;
        return ti;
    }
    for (size_t k = 0; k < t.size.size(); ++k) last += (unsigned __int128)(uint64_t)(t.size[k] - 1) * (uint64_t)t.stride[k];
    if (last >= storage_numel)
        fail(ErrorKind::InvalidInput,
             "'{}': tensor '{}' reaches element {} of a storage of {} elements (storage offset out of range, or the file is truncated)",
             label, pn, (uint64_t)std::min<unsigned __int128>(last, UINT64_MAX), storage_numel);
    bool contiguous = true;
    int64_t expect = 1;
    for (size_t k = t.size.size(); k-- > 0;) {
        if (t.size[k] == 1) continue;
        if (t.stride[k] != expect) contiguous = false;
        expect *= t.size[k];
    }
    ti.nbytes = (uint64_t)numel * es;
    if (contiguous) {
        ti.offset = sb.offset + (uint64_t)t.i * es;
        ti.side = sb.side;
        return ti;
    }
    // A strided view (a transpose, a slice with steps): copied into the side buffer contiguously.
    // Overlapping or broadcast views (more elements than the storage) are refused.
    if (numel > storage_numel)
        fail(ErrorKind::InvalidInput,
             "'{}': tensor '{}' is a broadcast or overlapping view ({} elements over a storage of {}): save it with .contiguous()", label, pn,
             (uint64_t)numel, storage_numel);
    if (side.buf.size() + ti.nbytes > side.cap)
        fail(ErrorKind::InvalidInput,
             "'{}': its strided (non-contiguous) tensors would need more than {} MiB of copies: save the tensors with .contiguous()", label,
             side.cap >> 20);
    const uint64_t base = side.buf.size();
    side.buf.resize(base + ti.nbytes);
    const size_t nd = t.size.size();
    std::vector<int64_t> idx(nd, 0);
    const uint8_t* src = (sb.side ? side.buf.data() : file.data()) + sb.offset;  // after the resize: the buffer may have moved
    uint8_t* dst = side.buf.data() + base;
    for (uint64_t e = 0; e < (uint64_t)numel; ++e) {
        uint64_t at = (uint64_t)t.i;
        for (size_t k = 0; k < nd; ++k) at += (uint64_t)idx[k] * (uint64_t)t.stride[k];
        std::memcpy(dst + e * es, src + at * es, es);
        for (size_t k = nd; k-- > 0;) {
            if (++idx[k] < t.size[k]) break;
            idx[k] = 0;
        }
    }
    ti.side = true;
    ti.offset = base;
    return ti;
}

/// Collects the Storage nodes reachable from the tensors: key -> node.
std::map<std::string, const Node*> storages_of(const pickle::Unpickled& u, const pickle::StateDict& sd, const std::string& label) {
    std::map<std::string, const Node*> m;
    for (auto& ft : sd.tensors) {
        const Node& st = u.at(u.at(ft.node).items.at(0));
        auto [it, fresh] = m.emplace(st.s, &st);
        if (!fresh && it->second->dtype != st.dtype)
            fail(ErrorKind::InvalidInput, "'{}': storage '{}' is named with two element types", label, printable(st.s));
    }
    return m;
}

void add_metadata(ParsedFile& out, const pickle::StateDict& sd) {
    auto put = [&](const std::string& k, const std::string& v) {
        MetaValue mv;
        mv.s = v;
        out.metadata[k] = std::move(mv);
    };
    if (!sd.wrapper.empty()) put("pytorch.state_dict_key", sd.wrapper);
    std::string unused;
    for (auto& w : sd.unused_wrappers) unused += (unused.empty() ? "" : ", ") + w;
    if (!unused.empty()) put("pytorch.unused_keys", unused);
    for (auto& [k, v] : sd.scalars) put(k, v);
}

/// Side buffer cap: twice the file plus 64 MiB (strided copies of a file's own storages).
uint64_t side_cap(uint64_t file_bytes) { return 2 * file_bytes + (64ull << 20); }

}  // namespace

bool is_pytorch_zip(std::span<const uint8_t> d) {
    return d.size() >= 4 && (rd(d, 0, 4) == 0x04034b50 || rd(d, 0, 4) == 0x06054b50);  // a local header, or an empty archive's end record
}

bool is_pytorch_legacy(std::span<const uint8_t> d) {
    static const uint8_t magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
    return d.size() >= sizeof(magic) && std::memcmp(d.data(), magic, sizeof(magic)) == 0;
}

ParsedFile parse_pytorch_zip(std::span<const uint8_t> data, const std::string& label) {
    ParsedFile out;
    out.format = "pytorch";
    const auto entries = read_zip(data, label);
    std::map<std::string, const ZipEntry*> by_name;
    for (auto& e : entries)
        if (!by_name.emplace(e.name, &e).second)
            fail(ErrorKind::InvalidInput, "'{}': the zip holds '{}' twice", label, printable(e.name));
    // <archive>/data.pkl: the archive folder is whatever torch.save named it (file stem or "archive").
    const ZipEntry* pkl = nullptr;
    for (auto& e : entries) {
        const size_t slash = e.name.find('/');
        if (slash != std::string::npos && e.name.substr(slash) == "/data.pkl") {
            if (pkl) fail(ErrorKind::InvalidInput, "'{}': the zip holds two data.pkl records", label);
            pkl = &e;
        }
    }
    if (!pkl) {
        if (by_name.empty()) fail(ErrorKind::InvalidInput, "'{}' is an empty zip archive, not a PyTorch checkpoint", label);
        fail(ErrorKind::InvalidInput, "'{}' is a zip archive without an <archive>/data.pkl record: not a PyTorch checkpoint", label);
    }
    const std::string prefix = pkl->name.substr(0, pkl->name.size() - 8);  // "<archive>/"
    // small records (data.pkl, byteorder): their bytes, inflated when deflated
    auto record = [&](const ZipEntry& e, std::vector<uint8_t>& keep) -> std::span<const uint8_t> {
        if (e.method == 0) return data.subspan((size_t)e.data, (size_t)e.size);
        if (e.usize > (1ull << 30)) fail(ErrorKind::InvalidInput, "'{}': the record '{}' claims {} bytes", label, printable(e.name), e.usize);
        keep.resize((size_t)e.usize);
        inflate_entry(data, e, keep.data(), label);
        return keep;
    };
    if (auto it = by_name.find(prefix + "byteorder"); it != by_name.end()) {
        std::vector<uint8_t> keep;
        const auto b = record(*it->second, keep);
        const std::string bo((const char*)b.data(), std::min<size_t>(b.size(), 16));
        if (bo != "little") fail(ErrorKind::Unsupported, "'{}' was saved on a big-endian machine (byteorder '{}'): easel reads little-endian files", label, printable(bo));
    }
    std::vector<uint8_t> pkl_bytes;
    const auto u = pickle::unpickle(record(*pkl, pkl_bytes), label);
    const auto sd = pickle::select_state_dict(u, label);
    std::map<std::string, StorageBytes> where;
    for (auto& [key, st] : storages_of(u, sd, label)) {
        auto it = by_name.find(prefix + "data/" + key);
        if (it == by_name.end())
            fail(ErrorKind::InvalidInput, "'{}': storage '{}' is not in the zip (no '{}data/{}' record: truncated or damaged file)", label,
                 printable(key), printable(prefix), printable(key));
        const ZipEntry& e = *it->second;
        const uint64_t es = dtype_size(st->dtype);
        if ((unsigned __int128)(uint64_t)st->i * es > e.usize)
            fail(ErrorKind::InvalidInput, "'{}': storage '{}' declares {} elements of {} bytes but its record holds {} bytes (truncated file)",
                 label, printable(key), st->i, es, e.usize);
        if (e.method == 0) {
            where[key] = {e.data, (uint64_t)st->i * es, false};
            continue;
        }
        // deflated: inflated into the side buffer (bounded by the 1032:1 deflate ratio checked above)
        const uint64_t at = out.side.size();
        out.side.resize(at + e.usize);
        inflate_entry(data, e, out.side.data() + at, label);
        where[key] = {at, (uint64_t)st->i * es, true};
    }
    Side side{out.side, out.side.size() + side_cap(data.size())};
    for (auto& ft : sd.tensors) {
        const Node& st = u.at(u.at(ft.node).items[0]);
        out.tensors.push_back(make_tensor(u, ft, where.at(st.s), data, side, label));
    }
    add_metadata(out, sd);
    return out;
}

ParsedFile parse_pytorch_legacy(std::span<const uint8_t> data, const std::string& label) {
    ParsedFile out;
    out.format = "pytorch-legacy";
    auto bad = [&](const std::string& what) -> void {
        fail(ErrorKind::InvalidInput, "'{}' is not a readable legacy PyTorch checkpoint: {}", label, what);
    };
    size_t pos = 0;
    auto next = [&]() {
        auto u = pickle::unpickle(data.subspan(pos), label);
        pos += u.consumed;
        return u;
    };
    {
        auto magic = next();
        const Node& m = magic.at(magic.root);
        static const uint8_t want[] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
        if (m.kind != K::BigInt || m.s.size() != sizeof(want) || std::memcmp(m.s.data(), want, sizeof(want)) != 0) bad("wrong magic number");
    }
    {
        auto proto = next();
        const Node& p = proto.at(proto.root);
        if (p.kind != K::Int || p.i != 1001) bad(fmt::format("protocol version {} (expected 1001)", p.kind == K::Int ? p.i : -1));
    }
    {
        auto info = next();
        const Node& d = info.at(info.root);
        if (d.kind != K::Dict) bad("sys_info is not a dict");
        for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
            const Node& key = info.at(d.items[k]);
            const Node& v = info.at(d.items[k + 1]);
            if (key.kind == K::String && key.s == "little_endian" && v.kind == K::Bool && !v.b)
                fail(ErrorKind::Unsupported, "'{}' was saved on a big-endian machine: easel reads little-endian files", label);
        }
    }
    const auto u = next();
    const auto sd = pickle::select_state_dict(u, label);
    const auto keys_p = next();
    const Node& keys = keys_p.at(keys_p.root);
    if (keys.kind != K::List) bad("the storage key list is not a list");
    const auto used = storages_of(u, sd, label);
    // Every storage the object names (not only those of the tensors kept) is in the stream, in
    // the key list's order; its dtype (element size) comes from its persistent id.
    std::map<std::string, DType> all;
    for (auto& n : u.nodes)
        if (n.kind == K::Storage) all.emplace(n.s, n.dtype);
    std::map<std::string, StorageBytes> where;
    for (uint32_t ki : keys.items) {
        const Node& k = keys_p.at(ki);
        if (k.kind != K::String) bad("a storage key that is not a string");
        auto it = all.find(k.s);
        if (it == all.end()) bad(fmt::format("storage '{}' is listed but never named in the object", printable(k.s)));
        if (where.count(k.s)) bad(fmt::format("storage '{}' is listed twice", printable(k.s)));
        if (data.size() - pos < 8) bad(fmt::format("the file ends before storage '{}' (truncated file)", printable(k.s)));
        const uint64_t numel = rd(data, pos, 8);
        pos += 8;
        const uint64_t es = dtype_size(it->second);
        if (numel > (data.size() - pos) / es)
            bad(fmt::format("storage '{}' of {} elements runs past the end of the file (truncated file)", printable(k.s), numel));
        where[k.s] = {pos, numel * es, false};
        pos += (size_t)(numel * es);
    }
    for (auto& [key, st] : used)
        if (!where.count(key)) bad(fmt::format("storage '{}' is used by a tensor but not in the file", printable(key)));
    Side side{out.side, side_cap(data.size())};
    for (auto& ft : sd.tensors) {
        const Node& st = u.at(u.at(ft.node).items[0]);
        out.tensors.push_back(make_tensor(u, ft, where.at(st.s), data, side, label));
    }
    add_metadata(out, sd);
    return out;
}

}  // namespace easel::io::detail
