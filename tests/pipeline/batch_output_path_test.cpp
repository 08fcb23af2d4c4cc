// pipeline::batch_output_path: the -o pattern of a batch. The pattern is user input: only %d
// style placeholders are replaced (a %s or %n once reached snprintf as a format and crashed).
#include "pipeline/generate.h"

#include <gtest/gtest.h>

using easel::pipeline::batch_output_path;

TEST(BatchOutputPath, PlaceholdersAreReplacedAndNothingElseIsFormatted) {
    EXPECT_EQ(batch_output_path("out_%d.png", 0, 2), "out_1.png");
    EXPECT_EQ(batch_output_path("out_%03d.png", 1, 2), "out_002.png");
    EXPECT_EQ(batch_output_path("out_%3d.png", 9, 12), "out_ 10.png");
    EXPECT_EQ(batch_output_path("a_%s_%n_%d.png", 0, 1), "a_%s_%n_1.png");
    EXPECT_EQ(batch_output_path("%d_%d.png", 1, 2), "2_2.png");
    EXPECT_EQ(batch_output_path("100%%_%d.png", 0, 1), "100%_1.png");
    EXPECT_EQ(batch_output_path("/tmp/probe_%0s.png", 1, 2), "/tmp/probe_%0s_2.png");  // no placeholder: the batch rule
    EXPECT_EQ(batch_output_path("plain.png", 0, 2), "plain.png");
    EXPECT_EQ(batch_output_path("dir/plain.png", 1, 2), "dir/plain_2.png");
    EXPECT_EQ(batch_output_path("trailing%", 0, 1), "trailing%");
}

// --output-begin-idx (sd-cli): %d counts from the given number; without a %d every image of a
// batch gets NAME_<number> (sd-cli's save_results), a single image keeps the name.
TEST(BatchOutputPath, OutputBeginIdx) {
    EXPECT_EQ(batch_output_path("out_%d.png", 0, 2, 0), "out_0.png");
    EXPECT_EQ(batch_output_path("out_%03d.png", 1, 2, 5), "out_006.png");
    EXPECT_EQ(batch_output_path("plain.png", 0, 2, 5), "plain_5.png");
    EXPECT_EQ(batch_output_path("dir/plain.png", 1, 2, 5), "dir/plain_6.png");
    EXPECT_EQ(batch_output_path("plain.png", 0, 1, 5), "plain.png");
    EXPECT_EQ(batch_output_path("plain.png", 1, 2, -1), "plain_2.png");  // not given: easel's default
}
