#include "models/vae/graph_exec.h"

#include <ggml-alloc.h>
#include <ggml-cpu.h>

#include <algorithm>
#include <memory>

namespace easel::vae {

HostTensor run_image_graph(ggml_backend_t backend, const HostTensor& in, const ImageGraphFn& fn,
                           const ExecOptions& opt) {
    if (in.numel() <= 0 || in.data.size() != size_t(in.numel()))
        fail(ErrorKind::InvalidInput, "empty or inconsistent input tensor {}x{}x{}x{} for a VAE graph", in.n, in.c, in.h, in.w);
    if (!backend) fail(ErrorKind::Internal, "run_image_graph called without a backend");

    ggml_init_params ip{};
    ip.mem_size = ggml_tensor_overhead() * opt.graph_size + ggml_graph_overhead_custom(opt.graph_size, false);
    ip.no_alloc = true;
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx(ggml_init(ip), &ggml_free);
    if (!ctx) fail(ErrorKind::OutOfMemory, "cannot allocate a ggml context of {} bytes for the VAE graph", ip.mem_size);

    ggml_tensor* x = ggml_new_tensor_4d(ctx.get(), GGML_TYPE_F32, in.w, in.h, in.c, in.n);
    ggml_set_name(x, "vae_input");
    ggml_set_input(x);
    nn::Ctx c{ctx.get(), opt.flash_attn, backend};
    ggml_tensor* out = fn(c, x);
    if (!out || out->type != GGML_TYPE_F32)
        fail(ErrorKind::Internal, "VAE graph produced no F32 output");
    ggml_set_name(out, "vae_output");
    ggml_set_output(out);

    ggml_cgraph* gf = ggml_new_graph_custom(ctx.get(), opt.graph_size, false);
    ggml_build_forward_expand(gf, out);

    std::unique_ptr<ggml_gallocr, decltype(&ggml_gallocr_free)> galloc(
        ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend)), &ggml_gallocr_free);
    if (!ggml_gallocr_alloc_graph(galloc.get(), gf))
        fail(ErrorKind::OutOfMemory,
             "cannot allocate the VAE compute buffer on {} for a {}x{} input; use --vae-tiling or a smaller image",
             ggml_backend_name(backend), in.h, in.w);
    if (opt.compute_bytes) *opt.compute_bytes = std::max(*opt.compute_bytes, ggml_gallocr_get_buffer_size(galloc.get(), 0));

    ggml_backend_tensor_set(x, in.data.data(), 0, ggml_nbytes(x));
    if (opt.n_threads > 0 && ggml_backend_is_cpu(backend)) ggml_backend_cpu_set_n_threads(backend, opt.n_threads);
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS)
        fail(ErrorKind::Internal, "the {} backend failed to compute the VAE graph", ggml_backend_name(backend));

    HostTensor r(out->ne[3], out->ne[2], out->ne[1], out->ne[0]);
    if (!ggml_is_contiguous(out)) fail(ErrorKind::Internal, "VAE graph output is not contiguous");
    ggml_backend_tensor_get(out, r.data.data(), 0, ggml_nbytes(out));
    return r;
}

}  // namespace easel::vae
