#include "core/build_id.h"

#include "easel_version.h"

#include <fmt/format.h>

#if defined(__linux__)
#include <elf.h>
#include <link.h>
#endif

#include <cstdint>
#include <cstring>

namespace easel {

namespace {

#if defined(__linux__)
struct Search {
    uintptr_t addr = 0;  ///< an address inside easel's code
    std::string id;      ///< hex build-id of the object holding it
};

/// dl_iterate_phdr callback: for the loaded object whose PT_LOAD segments hold s->addr, the
/// descriptor of its NT_GNU_BUILD_ID note.
int find_build_id(dl_phdr_info* info, size_t, void* data) {
    auto* s = static_cast<Search*>(data);
    bool holds = false;
    for (int i = 0; i < info->dlpi_phnum && !holds; ++i) {
        const auto& ph = info->dlpi_phdr[i];
        const uintptr_t b = info->dlpi_addr + ph.p_vaddr;
        holds = ph.p_type == PT_LOAD && s->addr >= b && s->addr < b + ph.p_memsz;
    }
    if (!holds) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const auto& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_NOTE) continue;
        const auto* p = reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr);
        const uint8_t* end = p + ph.p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            ElfW(Nhdr) n;
            std::memcpy(&n, p, sizeof n);
            const uint8_t* name = p + sizeof n;
            const uint8_t* desc = name + ((n.n_namesz + 3) & ~3u);
            const uint8_t* next = desc + ((n.n_descsz + 3) & ~3u);
            if (next > end) break;
            if (n.n_type == NT_GNU_BUILD_ID && n.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
                for (uint32_t k = 0; k < n.n_descsz; ++k) s->id += fmt::format("{:02x}", desc[k]);
                return 1;
            }
            p = next;
        }
    }
    return 1;  // the object holding easel's code has no build-id note
}
#endif

std::string compute() {
    std::string id;
#if defined(__linux__)
    Search s;
    s.addr = reinterpret_cast<uintptr_t>(&build_identity);
    dl_iterate_phdr(find_build_id, &s);
    id = s.id;
#endif
    if (id.empty()) id = std::string("compiled ") + __DATE__ + " " + __TIME__;
    return fmt::format("easel {} ggml {} build {}", EASEL_VERSION, EASEL_GGML_COMMIT, id);
}

}  // namespace

const std::string& build_identity() {
    static const std::string s = compute();
    return s;
}

}  // namespace easel
