// Block tree: parameter declaration and traversal (see block.h).
#include "nn/block.h"

#include "core/error.h"

namespace easel::nn {

Param& Block::param(const std::string& name, std::vector<int64_t> shape, ParamRole role, bool optional) {
    if (name.empty() || name.find('.') != std::string::npos)
        fail(ErrorKind::Internal, "parameter name '{}' must be non-empty and contain no dots", name);
    for (auto& [n, p] : params_)
        if (n == name) fail(ErrorKind::Internal, "parameter '{}' declared twice in one block", name);
    auto p = std::make_unique<Param>();
    p->shape = std::move(shape);
    p->role = role;
    p->optional = optional;
    Param& ref = *p;
    params_.emplace_back(name, std::move(p));
    return ref;
}

// An empty child name adds no path component (a grouping Block whose children carry full names).
static std::string join(const std::string& prefix, const std::string& name) {
    if (name.empty()) return prefix;
    return prefix.empty() ? name : prefix + "." + name;
}

void Block::visit_params(const std::string& prefix, const std::function<void(const std::string&, Param&)>& fn) {
    for (auto& [n, p] : params_) fn(join(prefix, n), *p);
    for (auto& [n, c] : children_) c->visit_params(join(prefix, n), fn);
}

void Block::visit_params(const std::string& prefix,
                         const std::function<void(const std::string&, const Param&)>& fn) const {
    for (auto& [n, p] : params_) fn(join(prefix, n), *p);
    for (auto& [n, c] : children_) static_cast<const Block&>(*c).visit_params(join(prefix, n), fn);
}

size_t Block::param_count() const {
    size_t n = params_.size();
    for (auto& [name, c] : children_) n += c->param_count();
    return n;
}

void Block::visit_blocks(const std::function<void(Block&)>& fn) {
    fn(*this);
    for (auto& [name, child] : children_) child->visit_blocks(fn);
}

}  // namespace easel::nn
