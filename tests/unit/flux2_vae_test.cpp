// FLUX.2 VAE (diffusers AutoencoderKLFlux2) against tests/data/reference/autoencoder_kl_flux2_tiny:
// encode / decode through vae::AutoencoderKLModel (the BatchNorm statistics in the file are
// not parameters of it), and Flux2KleinPipeline's latent (de)normalisation + 2x2 unpatchify.
#include "core/error.h"
#include "models/flux/flux2_vae.h"
#include "models/vae/autoencoder_kl.h"

#include "flux_test_util.h"

#include <ggml-backend.h>
#include <ggml-cpu.h>

#include <gtest/gtest.h>

using namespace easel;
using namespace easel::fluxtest;
namespace flux = easel::models::flux;

namespace {

vae::HostTensor host(const T& t) {
    if (t.shape.size() != 4) throw std::runtime_error("not 4-D");
    vae::HostTensor h(t.shape[0], t.shape[1], t.shape[2], t.shape[3]);
    h.data = t.data;
    return h;
}

struct Backend {
    ggml_backend_t b = ggml_backend_cpu_init();
    ~Backend() { ggml_backend_free(b); }
};

}  // namespace

TEST(Flux2Vae, MatchesDiffusersTiny) {
    TensorMap w, io;
    auto fix = io::WeightIndex::open(ref("autoencoder_kl_flux2_tiny.safetensors"));
    read_fixture(fix, w, io);
    ASSERT_TRUE(w.count("bn.running_mean"));
    auto bytes = safetensors_bytes(w);
    auto idx = io::WeightIndex::open_memory(bytes, "flux2_vae");
    Backend be;
    vae::KLOverrides ov;
    ov.norm_num_groups = 8;  // the fixture's norm_num_groups (not visible in weights)
    auto m = vae::AutoencoderKLModel::load(idx, be.b, ov);
    EXPECT_EQ(m->config().latent_channels, 8);
    EXPECT_EQ(m->config().spatial_factor(), 2);
    auto stats = flux::Flux2LatentStats::load(idx);
    EXPECT_EQ(stats.mean.size(), 32u);
    EXPECT_FLOAT_EQ(stats.eps, 1e-4f);

    auto dist = m->encode(host(io.at("__input__.image")));
    const float e_mean = max_abs_diff(dist.mean.data, io.at("__output__.latent_mean").data);
    const float e_logvar = max_abs_diff(dist.logvar.data, io.at("__output__.latent_logvar").data);
    auto dec = m->decode(host(io.at("__input__.latent")));
    const float e_dec = max_abs_diff(dec.data, io.at("__output__.decoded_latent").data);
    // pipeline tail: de-normalise with the BatchNorm statistics, unpatchify, decode
    auto z = flux::flux2_diffusion_to_vae(host(io.at("__input__.latents_patchified_normalized")), stats);
    EXPECT_EQ(z.c, 8);
    EXPECT_EQ(z.h, 16);
    const float e_unpatch = max_abs_diff(z.data, io.at("__output__.pipeline_unpatchified").data);
    auto img = m->decode(z);
    const float e_pipe = max_abs_diff(img.data, io.at("__output__.pipeline_decoded").data);
    std::printf("flux2 vae: mean %.3g logvar %.3g decoded %.3g unpatchified %.3g pipeline_decoded %.3g\n", e_mean, e_logvar, e_dec,
                e_unpatch, e_pipe);
    EXPECT_LT(e_mean, 1e-4f);
    EXPECT_LT(e_logvar, 1e-4f);
    EXPECT_LT(e_dec, 1e-4f);
    EXPECT_LT(e_unpatch, 1e-5f);
    EXPECT_LT(e_pipe, 1e-4f);
    // and back: patchify + normalise gives the pipeline's latent again
    auto back = flux::flux2_vae_to_diffusion(z, stats);
    EXPECT_LT(max_abs_diff(back.data, io.at("__input__.latents_patchified_normalized").data), 1e-5f);
}

TEST(Flux2Vae, PatchifyByHand) {
    // [1, 1, 2, 4] values y*10 + x -> [1, 4, 1, 2]: channel dy*2 + dx, column x/2
    vae::HostTensor z(1, 1, 2, 4);
    for (int y = 0; y < 2; ++y)
        for (int x = 0; x < 4; ++x) z.at(0, 0, y, x) = float(y * 10 + x);
    auto p = flux::patchify_2x2(z);
    EXPECT_EQ(p.data, (std::vector<float>{0, 2, 1, 3, 10, 12, 11, 13}));
    EXPECT_EQ(flux::unpatchify_2x2(p).data, z.data);
    vae::HostTensor odd(1, 1, 3, 4);
    EXPECT_THROW(flux::patchify_2x2(odd), Error);
    TensorMap none{{"decoder.conv_in.weight", T{{1}, {0}}}};
    auto b = safetensors_bytes(none);
    auto idx = io::WeightIndex::open_memory(b, "no_bn");
    EXPECT_THROW(flux::Flux2LatentStats::load(idx), Error);
}

TEST(Flux2Vae, PackTokensByHand) {
    // [1, 2, 1, 3] (channels 0: 0 1 2, 1: 10 11 12) -> tokens [3, 2] = (0,10) (1,11) (2,12)
    vae::HostTensor x(1, 2, 1, 3);
    x.data = {0, 1, 2, 10, 11, 12};
    auto t = flux::flux2_pack_tokens(x);
    EXPECT_EQ(t, (std::vector<float>{0, 10, 1, 11, 2, 12}));
    EXPECT_EQ(flux::flux2_unpack_tokens(t, 1, 2, 1, 3).data, x.data);
    EXPECT_THROW(flux::flux2_unpack_tokens(t, 1, 2, 2, 3), Error);
}
