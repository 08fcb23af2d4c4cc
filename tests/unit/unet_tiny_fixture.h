// The tiny SD1.5-layout UNet fixture (tests/data/reference/unet_sd15_tiny.{safetensors,json}: diffusers'
// UNet2DConditionModel with random weights, its inputs __input__.* and output __output__.sample), shared by
// the placement runtime tests.
#pragma once

#include "io/weight_index.h"
#include "models/sd/unet.h"
#include "runtime/sequence_runner.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace easel::test_support {

/// A fixture tensor as F32 values; throws std::runtime_error naming it when absent.
inline std::vector<float> read_fixture(const io::WeightIndex& idx, const std::string& name) {
    const io::TensorInfo* t = idx.find(name);
    if (!t) throw std::runtime_error("fixture lacks " + name);
    return idx.read_f32(*t);
}

/// The UNet, its weight source and its inputs: sample [2, 4, 16, 16] (ne {16, 16, 4, 2}), timestep [2],
/// context [2, 77, 32] (ne {32, 77, 2}).
struct TinyUnet {
    static std::filesystem::path dir() { return std::filesystem::path(EASEL_TEST_DATA) / "reference"; }
    io::WeightIndex idx = io::WeightIndex::open(dir() / "unet_sd15_tiny.safetensors");
    models::sd::UNetConfig cfg = models::sd::infer_unet_config(
        idx, models::sd::unet_overrides_from_diffusers_config(
                 nlohmann::json::parse(std::ifstream(dir() / "unet_sd15_tiny.json")).at("config")));
    nn::TensorSource src = models::sd::make_unet_source(idx, cfg);
    models::sd::UNet2DCondition net{cfg};
    std::vector<float> sample = read_fixture(idx, "__input__.sample"), t = read_fixture(idx, "__input__.timestep"),
                       ctx = read_fixture(idx, "__input__.encoder_hidden_states");
    nn::LoadOptions opt() const {
        nn::LoadOptions o;
        o.check_unexpected = false;  // the fixture also holds __input__/__output__ tensors
        return o;
    }
    models::sd::UNetInputs inputs(runtime::GraphBuilder& g) const {
        models::sd::UNetInputs in;
        in.sample = g.input_f32("sample", {16, 16, 4, 2}, sample);
        in.timestep = g.input_f32("timestep", {2}, t);
        in.context = g.input_f32("context", {32, 77, 2}, ctx);
        return in;
    }
};

using TinyUnetRunner = runtime::SequenceRunner<models::sd::UNetInputs, models::sd::UNetState, ggml_tensor*>;

}  // namespace easel::test_support
