// Running one image-to-image ggml graph on one backend: host input in, host output out.
//
// A small executor for the VAE modules (one input tensor, one output tensor). The general
// segment/streaming machinery lives in src/runtime; this is the single-device path used by
// the VAE's encode/decode and by its tiled variants, which run one graph per tile.
#pragma once

#include "models/vae/host_tensor.h"
#include "nn/layers.h"

#include <ggml-backend.h>

#include <functional>

namespace easel::vae {

/// Builds the output tensor from the graph input x (ggml ne = {W, H, C, N}, F32).
using ImageGraphFn = std::function<ggml_tensor*(nn::Ctx& c, ggml_tensor* x)>;

/// Options of run_image_graph().
struct ExecOptions {
    bool flash_attn = false;   ///< passed to nn::Ctx
    int n_threads = 0;         ///< CPU backend threads; 0 keeps the backend's setting
    size_t graph_size = 16384; ///< maximum graph nodes
    /// When set, raised to the bytes of each graph's compute buffer (ggml_gallocr_get_buffer_size;
    /// with tiling the largest tile's), for the stage lines' "compute" figure.
    size_t* compute_bytes = nullptr;
};

/// Builds the graph `fn` over an input of the shape of `in`, allocates its compute buffer on
/// `backend` (parameters must already live in memory that backend can read), uploads `in`,
/// computes and downloads the result as a [N, C, H, W] HostTensor (the output must be F32 and
/// at most 4-D; ne = {W, H, C, N}).
/// Throws Error(OutOfMemory) when the compute buffer cannot be allocated, Error(Internal) when
/// the backend fails to compute, Error(InvalidInput) for an empty input.
HostTensor run_image_graph(ggml_backend_t backend, const HostTensor& in, const ImageGraphFn& fn,
                           const ExecOptions& opt = {});

}  // namespace easel::vae
