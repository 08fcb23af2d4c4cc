#include "models/module_set.h"

#include "core/log.h"
#include "models/model_files.h"

#include <filesystem>

namespace easel::models {

void ResolvedSources::require(size_t i, const std::string& who) const {
    if (!folder || i >= sources.size() || !sources[i].empty()) return;
    fail(ErrorKind::ModelMismatch, "-m {}: this diffusers pipeline ({}) has no {} folder; {} have one", model,
         pipeline_class.empty() ? "unknown class" : pipeline_class, rule_components[i], who);
}

const io::PipelineComponent* ResolvedSources::component(const std::string& name) const {
    for (const auto& c : components)
        if (c.name == name) return &c;
    return nullptr;
}

ResolvedSources resolve_sources(const ModelFiles& files, std::span<const SourceRule> rules) {
    ResolvedSources r;
    r.sources.resize(rules.size());
    r.model = files.model;
    for (const SourceRule& rule : rules) r.rule_components.emplace_back(rule.component);
    if (!files.model.empty()) {
        if (io::is_pipeline_folder(files.model)) {
            r.folder = true;
            r.components = io::list_pipeline_components(files.model, &r.pipeline_class);
            for (const auto& c : r.components) {
                for (size_t i = 0; i < rules.size(); ++i)
                    if (c.name == rules[i].component) r.sources[i].path = c.folder.string();
                if (c.name == "scheduler") r.scheduler_config = read_json(c.folder / "scheduler_config.json");
                std::error_code ec;
                if (c.name == "tokenizer" && std::filesystem::is_regular_file(c.folder / "tokenizer.json", ec))
                    r.tokenizer_json = (c.folder / "tokenizer.json").string();
            }
            r.model_desc = "diffusers folder " + files.model;
        } else {
            for (auto& s : r.sources) s.path = files.model;
            r.model_desc = files.model;
        }
        for (auto& s : r.sources) {
            s.flag = "-m";
            s.arg = files.model;
        }
    }
    for (size_t i = 0; i < rules.size(); ++i) {
        if (!rules[i].file) continue;
        const std::string& given = files.*(rules[i].file);
        if (given.empty()) continue;
        r.sources[i].path = given;
        r.sources[i].flag = rules[i].flag;
        r.sources[i].arg = given;
    }
    if (r.model_desc.empty()) r.model_desc = files.diffusion_model;
    return r;
}

void merge_peaks(std::map<std::string, uint64_t>& a, const std::map<std::string, uint64_t>& b) {
    for (auto& [d, v] : b) a[d] = std::max(a[d], v);
}

std::vector<placement::ModulePlan> ModuleSlotBase::plans() const {
    auto c = current_plans();
    if (!c.empty()) return c;
    return kept_plans_;
}

std::map<std::string, uint64_t> ModuleSlotBase::peaks() const {
    std::map<std::string, uint64_t> p = kept_peaks_;
    merge_peaks(p, current_peaks());
    return p;
}

void ModuleSlotBase::keep_run(placement::ModulePlan plan, const std::string& device, uint64_t peak) {
    kept_plans_ = {std::move(plan)};
    kept_peaks_[device] = std::max(kept_peaks_[device], peak);
}

void ModuleSlotBase::keep_current() {
    auto c = current_plans();
    if (c.empty()) return;  // never ran placed: what was kept before stays
    kept_plans_ = std::move(c);
    kept_peaks_ = current_peaks();
}

ModuleSlotBase* ModuleSet::find(Module m) const {
    for (auto& s : slots_)
        if (s->module() == m) return s.get();
    return nullptr;
}

ModuleSlotBase& ModuleSet::at(Module m, const std::string& family) const {
    ModuleSlotBase* s = find(m);
    if (!s) fail(ErrorKind::Unsupported, "{} has no {} module", family, module_name(m));
    return *s;
}

void ModuleSet::load(Module m, bool placement, const std::string& family) {
    ModuleSlotBase& s = at(m, family);
    if (s.loaded()) return;
    s.load(placement);
    log::debug("loaded {} ({:.1f} MiB)", module_name(m), (double)s.param_bytes() / (1024.0 * 1024.0));
}

void ModuleSet::unload(Module m) {
    if (ModuleSlotBase* s = find(m)) s->unload();
}

bool ModuleSet::loaded(Module m) const {
    const ModuleSlotBase* s = find(m);
    return s && s->loaded();
}

size_t ModuleSet::param_bytes(Module m) const {
    const ModuleSlotBase* s = find(m);
    return s ? s->param_bytes() : 0;
}

size_t ModuleSet::compute_bytes(Module m) const {
    const ModuleSlotBase* s = find(m);
    return s ? s->compute_bytes() : 0;
}

std::vector<std::string> ModuleSet::files(Module m) const {
    const ModuleSlotBase* s = find(m);
    return s ? s->files() : std::vector<std::string>{};
}

std::vector<placement::ModuleCosts> ModuleSet::costs(int64_t h, int64_t w, bool skip_te) const {
    std::vector<placement::ModuleCosts> out;
    for (auto& s : slots_) {
        if (skip_te && s->module() == Module::Te) continue;
        auto c = s->costs(h, w);
        for (auto& x : c) out.push_back(std::move(x));
    }
    return out;
}

std::vector<placement::ModulePlan> ModuleSet::plans() const {
    std::vector<placement::ModulePlan> r;
    for (auto& s : slots_) {
        auto p = s->plans();
        r.insert(r.end(), p.begin(), p.end());
    }
    return r;
}

std::map<std::string, uint64_t> ModuleSet::peaks() const {
    std::map<std::string, uint64_t> p;
    for (auto& s : slots_) merge_peaks(p, s->peaks());
    return p;
}

}  // namespace easel::models
