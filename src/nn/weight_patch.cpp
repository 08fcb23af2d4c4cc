// Registries of weight patches and run-time updates (see weight_patch.h).
#include "nn/weight_patch.h"

#include "core/error.h"

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

namespace easel::nn {

namespace {

struct Registered {
    uint64_t id;
    std::shared_ptr<const WeightPatches> patches;
    std::string name;
};

std::mutex g_mu;
std::map<StoredKey, Registered> g_patches;
std::atomic<size_t> g_n_patches{0};
uint64_t g_next_id = 1;

struct Bound {
    std::shared_ptr<const RuntimeUpdate> update;
    ggml_backend_buffer_t owner;
    std::shared_ptr<void> keep;  ///< the update tensors' context and buffer
};
std::mutex g_rt_mu;
std::unordered_map<const Param*, Bound> g_runtime;
std::atomic<size_t> g_n_runtime{0};

thread_local int t_row_split = 0;

std::string normal_path(const std::filesystem::path& p) {
    std::error_code ec;
    auto c = std::filesystem::weakly_canonical(p, ec);
    return (ec ? p : c).lexically_normal().string();
}

}  // namespace

bool StoredKey::operator<(const StoredKey& o) const {
    return std::tie(file, offset, nbytes, side) < std::tie(o.file, o.offset, o.nbytes, o.side);
}

StoredKey stored_key(const io::WeightIndex& index, const io::TensorInfo& info) {
    StoredKey k;
    const auto& files = index.files();
    if (info.file < files.size()) k.file = normal_path(files[info.file].path);
    k.offset = info.offset;
    k.nbytes = info.nbytes;
    k.side = info.side;
    return k;
}

PatchRegistration::~PatchRegistration() {
    std::lock_guard<std::mutex> l(g_mu);
    std::erase_if(g_patches, [&](const auto& kv) { return kv.second.id == id_; });
    g_n_patches = g_patches.size();
}

std::unique_ptr<PatchRegistration> register_patches(std::vector<PatchEntry> entries) {
    std::lock_guard<std::mutex> l(g_mu);
    const uint64_t id = g_next_id++;
    for (const PatchEntry& e : entries)
        if (auto it = g_patches.find(e.key); it != g_patches.end())
            fail(ErrorKind::InvalidInput,
                 "weights of {} are patched by LoRAs of another model open at the same time; close it first (one LoRA set per model file)",
                 e.key.file);
    for (PatchEntry& e : entries) g_patches[e.key] = Registered{id, std::move(e.patches), std::move(e.name)};
    g_n_patches = g_patches.size();
    return std::make_unique<PatchRegistration>(id);
}

std::optional<FoundPatch> find_patch(const io::WeightIndex& index, const io::TensorInfo& info) {
    if (g_n_patches.load() == 0) return std::nullopt;
    const StoredKey k = stored_key(index, info);
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_patches.find(k);
    if (it == g_patches.end()) return std::nullopt;
    return FoundPatch{it->second.patches, it->second.name};
}

RowSplitReadScope::RowSplitReadScope() { ++t_row_split; }
RowSplitReadScope::~RowSplitReadScope() { --t_row_split; }

const RuntimeUpdate* runtime_update(const Param& p) {
    if (g_n_runtime.load() == 0) return nullptr;
    std::lock_guard<std::mutex> l(g_rt_mu);
    auto it = g_runtime.find(&p);
    return it == g_runtime.end() ? nullptr : it->second.update.get();
}

namespace detail {

void bind_runtime(const Param* p, std::shared_ptr<const RuntimeUpdate> u, ggml_backend_buffer_t owner, std::shared_ptr<void> keep) {
    std::lock_guard<std::mutex> l(g_rt_mu);
    g_runtime[p] = Bound{std::move(u), owner, std::move(keep)};
    g_n_runtime = g_runtime.size();
}

void unbind_runtime(const Param* p) {
    if (g_n_runtime.load() == 0) return;
    std::lock_guard<std::mutex> l(g_rt_mu);
    g_runtime.erase(p);
    g_n_runtime = g_runtime.size();
}

void forget_runtime(ggml_backend_buffer_t owner) {
    if (!owner || g_n_runtime.load() == 0) return;
    std::lock_guard<std::mutex> l(g_rt_mu);
    std::erase_if(g_runtime, [&](const auto& kv) { return kv.second.owner == owner; });
    g_n_runtime = g_runtime.size();
}

bool row_split_reading() { return t_row_split > 0; }

}  // namespace detail

}  // namespace easel::nn
