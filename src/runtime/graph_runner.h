// GraphRunner: build a ggml graph from host inputs, run it on one backend, read outputs back.
//
// The small reusable executor every model test and the first pipeline use:
//
//   runtime::GraphRunner run;                          // CPU backend, all cores
//   auto params = nn::ParamBuffer::load(model, src, run.buffer_type());
//   auto out = run.run([&](runtime::GraphBuilder& g) {
//       ggml_tensor* ids = g.input_i32("ids", {77, 1}, ids_host);
//       nn::Ctx c{g.ctx()};
//       return std::vector<ggml_tensor*>{model.forward(c, ids)};
//   });
//   out[0].data, out[0].ne                             // F32 values, ggml order
//
// The build function runs in a fresh no_alloc ggml_context; inputs declared through the
// GraphBuilder are allocated with the graph (ggml_gallocr on the backend's buffer type) and
// their host data copied in before compute. Parameters must live in a buffer the backend can
// read (for a CPU backend: host memory; for a GPU: that GPU or, where supported, host memory).
#pragma once

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml.h>

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace easel::runtime {

/// One output read back to the host: values in ggml order (ne[0] fastest), converted to F32.
struct HostTensor {
    std::string name;
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    std::vector<float> data;
    int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

/// Declares graph inputs with host data while a graph is being built.
class GraphBuilder {
public:
    GraphBuilder() = default;
    /// A builder on an existing no_alloc context, for executors other than GraphRunner
    /// (runtime::SequenceRunner); the caller uploads inputs() after allocating the graph.
    GraphBuilder(ggml_context* ctx, ggml_backend_t backend) : ctx_(ctx), backend_(backend) {}
    /// The no_alloc context in which the graph is built.
    ggml_context* ctx() const { return ctx_; }
    /// The backend the graph will run on (for nn::Ctx::backend).
    ggml_backend_t backend() const { return backend_; }
    /// An F32 input of shape ne (ggml order, innermost first; trailing 1s may be left out);
    /// `data` is copied now and uploaded after allocation. Throws Error(InvalidInput) if
    /// data.size() differs from the element count.
    ggml_tensor* input_f32(const std::string& name, std::vector<int64_t> ne, std::span<const float> data);
    /// An I32 input (token ids, positions); as input_f32.
    ggml_tensor* input_i32(const std::string& name, std::vector<int64_t> ne, std::span<const int32_t> data);
    /// An input of any type with its raw bytes (ggml layout); throws Error(InvalidInput) when
    /// bytes.size() differs from ggml_nbytes of the shape.
    ggml_tensor* input_raw(const std::string& name, ggml_type type, std::vector<int64_t> ne, std::span<const uint8_t> bytes);

    /// An input declared so far and its host bytes.
    struct Input {
        ggml_tensor* t;
        std::vector<uint8_t> bytes;
    };
    const std::vector<Input>& inputs() const { return inputs_; }

private:
    friend class GraphRunner;
    ggml_tensor* add(const std::string& name, ggml_type type, std::vector<int64_t> ne, const void* data, size_t n, size_t elem);
    ggml_context* ctx_ = nullptr;
    ggml_backend_t backend_ = nullptr;
    std::vector<Input> inputs_;
};

/// Owns one ggml backend and runs graphs on it.
class GraphRunner {
public:
    /// A backend on `dev` (nullptr: the CPU device). n_threads <= 0: all hardware threads
    /// (applies to backends with a thread count: CPU, BLAS). Throws Error(Unsupported) if the
    /// backend cannot be created.
    explicit GraphRunner(ggml_backend_dev_t dev = nullptr, int n_threads = 0);
    ~GraphRunner();
    GraphRunner(const GraphRunner&) = delete;
    GraphRunner& operator=(const GraphRunner&) = delete;

    ggml_backend_t backend() const { return backend_; }
    ggml_backend_dev_t device() const { return dev_; }
    /// The buffer type to load parameters into for this backend (the device's default).
    ggml_backend_buffer_type_t buffer_type() const;
    /// Sets the CPU thread count (n <= 0: all hardware threads); no-op on backends without one.
    void set_threads(int n);

    /// Function building the graph: returns the output tensors (any type; read back as F32).
    using BuildFn = std::function<std::vector<ggml_tensor*>(GraphBuilder&)>;

    /// Builds the graph with `build` in a fresh context of at most `max_nodes` nodes, allocates
    /// it, uploads the inputs, computes, and returns the outputs in the order returned.
    /// Throws Error(OutOfMemory) when the compute buffer cannot be allocated, Error(Unsupported)
    /// when the backend cannot run an operation of the graph, Error(Internal) when compute fails.
    std::vector<HostTensor> run(const BuildFn& build, size_t max_nodes = 32768);

    /// Bytes of the compute buffer the last run() allocated (its measured peak).
    size_t last_compute_bytes() const { return last_compute_bytes_; }

private:
    ggml_backend_dev_t dev_ = nullptr;
    ggml_backend_t backend_ = nullptr;
    ggml_gallocr_t galloc_ = nullptr;
    size_t last_compute_bytes_ = 0;
};

}  // namespace easel::runtime
