// GraphRunner (see graph_runner.h).
#include "runtime/graph_runner.h"

#include "core/error.h"

#include <cstring>
#include <thread>

namespace easel::runtime {

ggml_tensor* GraphBuilder::add(const std::string& name, ggml_type type, std::vector<int64_t> ne, const void* data, size_t n,
                               size_t elem) {
    if (ne.empty() || ne.size() > 4)
        fail(ErrorKind::InvalidInput, "graph input '{}' needs 1 to 4 dimensions, got {}", name, ne.size());
    int64_t dims[4] = {1, 1, 1, 1};
    int64_t count = 1;
    for (size_t i = 0; i < ne.size(); ++i) {
        if (ne[i] <= 0) fail(ErrorKind::InvalidInput, "graph input '{}' has a non-positive dimension {}", name, ne[i]);
        dims[i] = ne[i];
        count *= ne[i];
    }
    if ((int64_t)n != count)
        fail(ErrorKind::InvalidInput, "graph input '{}' has {} values but its shape holds {}", name, n, count);
    ggml_tensor* t = ggml_new_tensor(ctx_, type, (int)ne.size(), dims);
    ggml_set_name(t, name.c_str());
    ggml_set_input(t);
    Input in{t, std::vector<uint8_t>(n * elem)};
    if (n && elem) std::memcpy(in.bytes.data(), data, n * elem);
    inputs_.push_back(std::move(in));
    return t;
}

ggml_tensor* GraphBuilder::input_f32(const std::string& name, std::vector<int64_t> ne, std::span<const float> data) {
    return add(name, GGML_TYPE_F32, std::move(ne), data.data(), data.size(), sizeof(float));
}

ggml_tensor* GraphBuilder::input_i32(const std::string& name, std::vector<int64_t> ne, std::span<const int32_t> data) {
    return add(name, GGML_TYPE_I32, std::move(ne), data.data(), data.size(), sizeof(int32_t));
}

ggml_tensor* GraphBuilder::input_raw(const std::string& name, ggml_type type, std::vector<int64_t> ne, std::span<const uint8_t> bytes) {
    int64_t count = 1;
    for (auto d : ne) count *= d;
    const int64_t blck = ggml_blck_size(type);
    if (ne.empty() || count <= 0 || ne[0] % blck != 0 || (size_t)(ggml_row_size(type, ne[0]) * (count / ne[0])) != bytes.size())
        fail(ErrorKind::InvalidInput, "graph input '{}': {} bytes do not match its shape and type {}", name, bytes.size(), ggml_type_name(type));
    // counted in elements of `type` for add(): bytes / element size of one row-block
    ggml_tensor* t = add(name, type, std::move(ne), bytes.data(), (size_t)count, 0);
    inputs_.back().bytes.assign(bytes.begin(), bytes.end());
    return t;
}

GraphRunner::GraphRunner(ggml_backend_dev_t dev, int n_threads) {
    dev_ = dev ? dev : ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev_) fail(ErrorKind::Unsupported, "no CPU device registered in ggml");
    backend_ = ggml_backend_dev_init(dev_, nullptr);
    if (!backend_) fail(ErrorKind::Unsupported, "cannot initialise a backend on device {}", ggml_backend_dev_name(dev_));
    set_threads(n_threads);
}

GraphRunner::~GraphRunner() {
    if (galloc_) ggml_gallocr_free(galloc_);
    if (backend_) ggml_backend_free(backend_);
}

ggml_backend_buffer_type_t GraphRunner::buffer_type() const { return ggml_backend_dev_buffer_type(dev_); }

void GraphRunner::set_threads(int n) {
    if (n <= 0) n = (int)std::max(1u, std::thread::hardware_concurrency());
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev_);
    if (!reg) return;
    auto fn = (ggml_backend_set_n_threads_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (fn) fn(backend_, n);
}

std::vector<HostTensor> GraphRunner::run(const BuildFn& build, size_t max_nodes) {
    ggml_init_params ip{};
    ip.mem_size = ggml_tensor_overhead() * max_nodes + ggml_graph_overhead_custom(max_nodes, false);
    ip.no_alloc = true;
    ggml_context* ctx = ggml_init(ip);
    if (!ctx) fail(ErrorKind::OutOfMemory, "cannot create a graph context for {} nodes", max_nodes);
    struct CtxGuard {
        ggml_context* c;
        ~CtxGuard() { ggml_free(c); }
    } guard{ctx};

    GraphBuilder gb;
    gb.ctx_ = ctx;
    gb.backend_ = backend_;
    std::vector<ggml_tensor*> outs = build(gb);
    ggml_cgraph* gf = ggml_new_graph_custom(ctx, max_nodes, false);
    std::vector<ggml_tensor*> reads;
    for (ggml_tensor* o : outs) {
        if (!o) fail(ErrorKind::Internal, "graph build returned a null output");
        ggml_tensor* r = o;
        if (r->type != GGML_TYPE_F32) r = ggml_cast(ctx, r, GGML_TYPE_F32);
        else if (r->view_src || !ggml_is_contiguous(r)) r = ggml_cont(ctx, r);
        ggml_set_output(r);
        ggml_build_forward_expand(gf, r);
        reads.push_back(r);
    }
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor* node = ggml_graph_node(gf, i);
        if (!ggml_backend_supports_op(backend_, node))
            fail(ErrorKind::Unsupported, "backend {} cannot run operation {} ({}) of type {}", ggml_backend_name(backend_),
                 ggml_op_desc(node), node->name, ggml_type_name(node->type));
    }

    if (!galloc_) galloc_ = ggml_gallocr_new(buffer_type());
    // Plan the allocation for this graph every time: ggml_gallocr_alloc_graph alone reuses the
    // previous plan when node count and shapes match, without comparing output flags, so a graph
    // that differs from the last one only in which intermediate tensors are outputs (e.g. other
    // hidden-state indices of a text encoder) would get its outputs overwritten.
    if (!ggml_gallocr_reserve(galloc_, gf) || !ggml_gallocr_alloc_graph(galloc_, gf))
        fail(ErrorKind::OutOfMemory, "cannot allocate the compute buffer on {} for a graph of {} nodes",
             ggml_backend_name(backend_), ggml_graph_n_nodes(gf));
    last_compute_bytes_ = ggml_gallocr_get_buffer_size(galloc_, 0);

    for (auto& in : gb.inputs_) {
        if (!in.t->buffer) continue;  // declared but unused by the graph
        ggml_backend_tensor_set(in.t, in.bytes.data(), 0, in.bytes.size());
    }
    ggml_status st = ggml_backend_graph_compute(backend_, gf);
    if (st != GGML_STATUS_SUCCESS)
        fail(st == GGML_STATUS_ALLOC_FAILED ? ErrorKind::OutOfMemory : ErrorKind::Internal, "graph compute on {} failed (status {})",
             ggml_backend_name(backend_), (int)st);

    std::vector<HostTensor> result;
    for (size_t i = 0; i < reads.size(); ++i) {
        HostTensor h;
        h.name = outs[i]->name;
        for (int d = 0; d < 4; ++d) h.ne[d] = reads[i]->ne[d];
        h.data.resize((size_t)ggml_nelements(reads[i]));
        ggml_tensor* r = reads[i];
        ggml_backend_tensor_get(r, h.data.data(), 0, h.data.size() * sizeof(float));
        result.push_back(std::move(h));
    }
    return result;
}

}  // namespace easel::runtime
