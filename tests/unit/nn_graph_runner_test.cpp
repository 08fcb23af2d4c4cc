// runtime::GraphRunner: inputs, outputs of any type/layout, errors.
#include "core/error.h"
#include "runtime/graph_runner.h"

#include <gtest/gtest.h>

using namespace easel;

TEST(NnGraphRunner, OutputsOfAnyTypeAndLayout) {
    runtime::GraphRunner run(nullptr, 2);
    std::vector<float> a = {1, 2, 3, 4, 5, 6};  // {3, 2}: rows {1,2,3}, {4,5,6}
    std::vector<int32_t> ids = {1, 0};
    auto out = run.run([&](runtime::GraphBuilder& g) {
        ggml_context* c = g.ctx();
        ggml_tensor* x = g.input_f32("x", {3, 2}, a);
        g.input_f32("unused", {1}, std::span<const float>(a.data(), 1));  // declared, never used
        ggml_tensor* i = g.input_i32("ids", {2}, ids);
        ggml_tensor* sum = ggml_add(c, x, x);                          // {3, 2}
        ggml_tensor* tr = ggml_transpose(c, x);                        // view {2, 3}
        ggml_tensor* h = ggml_cast(c, ggml_scale(c, x, 0.5f), GGML_TYPE_F16);
        ggml_tensor* rows = ggml_get_rows(c, x, i);  // rows 1 and 0 of x
        return std::vector<ggml_tensor*>{sum, tr, h, x, rows};
    });
    ASSERT_EQ(out.size(), 5u);
    EXPECT_EQ(out[0].data, (std::vector<float>{2, 4, 6, 8, 10, 12}));
    EXPECT_EQ(out[1].ne[0], 2);
    EXPECT_EQ(out[1].ne[1], 3);
    EXPECT_EQ(out[1].data, (std::vector<float>{1, 4, 2, 5, 3, 6}));  // transposed, made contiguous
    EXPECT_EQ(out[2].data, (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));  // F16 read back as F32
    EXPECT_EQ(out[3].data, a);                                            // an input returned as is
    EXPECT_EQ(out[4].data, (std::vector<float>{4, 5, 6, 1, 2, 3}));
    EXPECT_GT(run.last_compute_bytes(), 0u);
    // the runner is reusable
    auto again = run.run([&](runtime::GraphBuilder& g) {
        return std::vector<ggml_tensor*>{ggml_sum(g.ctx(), g.input_f32("x", {6}, a))};
    });
    EXPECT_EQ(again[0].data, (std::vector<float>{21}));
}

TEST(NnGraphRunner, InputErrors) {
    runtime::GraphRunner run(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), 1);
    std::vector<float> a(5, 1.0f);
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) { return std::vector<ggml_tensor*>{g.input_f32("x", {3, 2}, a)}; }), Error);
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) { return std::vector<ggml_tensor*>{g.input_f32("x", {0}, a)}; }), Error);
    EXPECT_THROW(run.run([&](runtime::GraphBuilder& g) { return std::vector<ggml_tensor*>{nullptr}; }), Error);
    try {
        run.run([&](runtime::GraphBuilder& g) { return std::vector<ggml_tensor*>{g.input_f32("x", {2, 2}, a)}; });
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
        EXPECT_NE(std::string(e.what()).find("'x' has 5 values but its shape holds 4"), std::string::npos) << e.what();
    }
}
