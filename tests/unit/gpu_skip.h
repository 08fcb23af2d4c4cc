// The one reason a test may skip: the machine (or the build) has no GPU for it. scripts/test.sh
// counts the skipped tests after ctest and fails the run when a skip's message does not carry
// this marker, so a test that cannot get its data, its rpc-servers or anything else fails
// instead of going quietly green.
#pragma once

#include <gtest/gtest.h>

/// Marker scripts/test.sh looks for in a skipped test's output.
#define EASEL_NO_GPU_MARKER "[no GPU]"

/// Skips the current test because no GPU is available; `why` says which GPU it needed.
#define EASEL_SKIP_WITHOUT_GPU(why) GTEST_SKIP() << EASEL_NO_GPU_MARKER " " << why
