// Test helper: checks an opened PyTorch checkpoint against an expected.json entry (every tensor's
// dtype, shape and values; selected metadata), as written by tools/make-malformed/pytorch_files.py
// and tools/reference/make_pth_fixtures.py.
#pragma once

#include "io/weight_index.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace easel::test {

using namespace easel::io;

inline void check_against_expected(const WeightIndex& wi, const nlohmann::json& want, const std::string& file) {
    const auto& tensors = want["tensors"];
    ASSERT_EQ(wi.tensors().size(), tensors.size()) << file;
    for (auto& [name, w] : tensors.items()) {
        const TensorInfo* t = wi.find(name);
        ASSERT_NE(t, nullptr) << file << ": " << name;
        EXPECT_EQ(dtype_name(t->dtype), w["dtype"].get<std::string>()) << file << ": " << name;
        EXPECT_EQ(t->shape, w["shape"].get<std::vector<int64_t>>()) << file << ": " << name;
        const auto vals = w["values"].get<std::vector<double>>();
        ASSERT_EQ((size_t)t->numel(), vals.size()) << file << ": " << name;
        const std::string dt = w["dtype"];
        if (dt[0] == 'F' || dt == "BF16") {
            const auto got = wi.read_f32(*t);
            for (size_t i = 0; i < vals.size(); ++i) ASSERT_EQ(got[i], (float)vals[i]) << file << ": " << name << "[" << i << "]";
        } else {
            const auto got = wi.read_i64(*t);
            for (size_t i = 0; i < vals.size(); ++i) ASSERT_EQ(got[i], (int64_t)vals[i]) << file << ": " << name << "[" << i << "]";
        }
    }
    if (want.contains("metadata"))
        for (auto& [k, v] : want["metadata"].items()) {
            auto it = wi.metadata().find(k);
            ASSERT_NE(it, wi.metadata().end()) << file << ": metadata " << k;
            EXPECT_EQ(it->second.s, v.get<std::string>()) << file << ": metadata " << k;
        }
}


}  // namespace easel::test
